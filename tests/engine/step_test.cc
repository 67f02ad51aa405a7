// The engine's step API on the CPU (include/slimkv/engine.h): many sequences of different lengths in
// one batched pass give each sequence what it gives alone; on-device-style sampling depends on the
// sequence and position only; the KV budget is counted and enforced; export → import continues a
// sequence exactly. The bundled model, on real text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "slimkv/engine.h"
#include "kv/store.h"
#include "kv/transfer.h"
#include "model/model_config.h"
#include "slimkv/tokenizer.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

std::unique_ptr<Engine> load(const std::string& spec, size_t kv_cache_bytes = 0, int max_sequences = 16) {
  EngineConfig config;
  config.model_dir = kModel;
  config.kv_spec = spec;
  config.threads = 2;
  config.kv_cache_bytes = kv_cache_bytes;
  config.max_sequences = max_sequences;
  auto engine = Engine::load(config);
  EXPECT_TRUE(engine) << engine.status().message();
  return engine ? std::move(*engine) : nullptr;
}

std::vector<int32_t> text_tokens(const Engine& engine, size_t count, size_t skip = 0) {
  std::ifstream in(kModel + "/passkey_prompt.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = engine.tokenizer()->encode(text.str());
  ids.erase(ids.begin(), ids.begin() + ptrdiff_t(skip));
  ids.resize(count);
  return ids;
}

float max_abs_difference(std::span<const float> a, std::span<const float> b) {
  float most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::abs(a[i] - b[i]));
  return most;
}

// Greedy tokens of one sequence run alone: prompt, then `steps` tokens.
std::vector<int32_t> greedy_alone(Engine& engine, const std::vector<int32_t>& prompt, int steps) {
  auto session = engine.new_session();
  auto logits = session->prefill(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < steps && logits; ++i) {
    out.push_back(int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin()));
    logits = session->decode(out.back());
  }
  return out;
}

// Each sequence's weight products take the path they take alone (MatmulItems) and its attention is its
// own: a mixed step gives every sequence the very logits it gets alone, with a quantizing codec too
// (where a last-bit difference would round a K/V value on a level boundary the other way).
class EngineStepMix : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineStepMix, MixedPrefillAndDecodeOfUnequalSequencesMatchEachAlone) {
  auto engine = load(GetParam());
  ASSERT_TRUE(engine);
  const std::vector<size_t> lengths = {1, 7, 64, 65, 130, 300};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(text_tokens(*engine, lengths[i], 17 * i));

  // Together: half the sequences first get a head start, so the step mixes decode rows and prefill chunks.
  // Alone: each the same way (a prompt run in one chunk reads its own tokens exactly, not sealed).
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto session = engine->new_session();
    if (i % 2 == 0 && prompts[i].size() > 1) {
      ASSERT_TRUE(session->prefill(std::span(prompts[i]).first(prompts[i].size() - 1)));
    }
    alone.push_back(*session->prefill(i % 2 == 0 ? std::span(prompts[i]).last(1) : std::span(prompts[i])));
  }
  std::vector<SequenceId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(*engine->add_sequence());
  StepResult result;
  std::vector<StepItem> items;
  for (size_t i = 0; i < prompts.size(); i += 2) {
    const auto head = std::span(prompts[i]).first(prompts[i].size() - 1);
    if (!head.empty()) items.push_back({ids[i], head, StepOutput::kNone});
  }
  ASSERT_TRUE(engine->step(items, result).is_ok());
  items.clear();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto rest = i % 2 == 0 ? std::span(prompts[i]).last(1) : std::span(prompts[i]);
    items.push_back({ids[i], rest, StepOutput::kLastLogits});
  }
  ASSERT_TRUE(engine->step(items, result).is_ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(max_abs_difference(result.logits_of(i), alone[i]), 0.0f) << "sequence " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, EngineStepMix, ::testing::Values("dense", "hack:bits=4,pi=64", "hack:bits=2,pi=64"));

TEST(EngineStep, AllLogitsRowsAndNoneAreLaidOutPerItem) {
  auto engine = load("dense");
  ASSERT_TRUE(engine);
  const auto a = text_tokens(*engine, 5), b = text_tokens(*engine, 3, 40);
  const auto expected_a = *engine->new_session()->prefill(a, /*all_logits=*/true);
  const SequenceId x = *engine->add_sequence(), y = *engine->add_sequence(), z = *engine->add_sequence();
  StepResult result;
  const std::vector<StepItem> items = {{x, a, StepOutput::kAllLogits}, {y, b, StepOutput::kNone}, {z, b, StepOutput::kLastLogits}};
  ASSERT_TRUE(engine->step(items, result).is_ok());
  EXPECT_EQ(result.first_row, (std::vector<int64_t>{0, -1, 5}));
  EXPECT_EQ(result.logits.size(), size_t(6 * result.vocab));
  for (int row = 0; row < 5; ++row) {
    EXPECT_LT(max_abs_difference(result.logits_of(0, row), std::span(expected_a).subspan(size_t(row * result.vocab), size_t(result.vocab))), 2e-3f);
  }
  EXPECT_EQ(*engine->num_tokens(y), 3);
}

TEST(EngineStep, SampledTokensDependOnTheSequenceNotItsBatch) {
  auto engine = load("dense");
  ASSERT_TRUE(engine);
  const SamplingParams sampling{.temperature = 2.0f, .top_k = 0, .top_p = 0.95f, .seed = 7};
  const auto prompt = text_tokens(*engine, 20);
  auto run = [&](int neighbours) {
    const SequenceId id = *engine->add_sequence(sampling);
    std::vector<SequenceId> others;
    for (int i = 0; i < neighbours; ++i) others.push_back(*engine->add_sequence({.temperature = 1.0f, .seed = uint64_t(100 + i)}));
    std::vector<int32_t> tokens;
    StepResult result;
    std::vector<int32_t> inputs(size_t(neighbours) + 1, 0);
    for (int step = 0; step < 12; ++step) {
      std::vector<StepItem> items;
      items.push_back({id, step == 0 ? std::span<const int32_t>(prompt) : std::span<const int32_t>(&inputs[0], 1), StepOutput::kSample});
      for (int i = 0; i < neighbours; ++i) {
        items.push_back({others[size_t(i)], step == 0 ? std::span<const int32_t>(prompt).first(size_t(3 + i))
                                                       : std::span<const int32_t>(&inputs[size_t(i) + 1], 1),
                         StepOutput::kSample});
      }
      EXPECT_TRUE(engine->step(items, result).is_ok());
      for (size_t i = 0; i < items.size(); ++i) inputs[i] = result.tokens[i];
      tokens.push_back(result.tokens[0]);
    }
    EXPECT_TRUE(engine->remove_sequence(id).is_ok());
    for (SequenceId other : others) EXPECT_TRUE(engine->remove_sequence(other).is_ok());
    return tokens;
  };
  const auto alone = run(0);
  EXPECT_EQ(run(3), alone);
  // Sampling does something: not every token is the greedy one.
  EXPECT_NE(alone, greedy_alone(*engine, prompt, 12));
}

TEST(EngineStep, BudgetIsCountedAndAStepBeyondItIsRefusedChangingNothing) {
  auto probe = load("hack:bits=2,pi=64");
  ASSERT_TRUE(probe);
  const KvBudget full = probe->kv_budget();
  EXPECT_EQ(full.block_tokens, 64);
  EXPECT_EQ(full.total_blocks, full.free_blocks);
  const ModelConfig& model = probe->model_config();
  EXPECT_EQ(full.total_blocks, 16 * (model.max_position_embeddings / 64));  // max_sequences full contexts by default
  // 10 blocks and the open blocks of 2 sequences: layers · KV heads · tokens · (k + v dims) · FP16.
  const size_t open_per_sequence = size_t(model.num_layers * model.num_kv_heads * 64 * 2 * model.head_dim * 2);
  auto engine = load("hack:bits=2,pi=64", 2 * open_per_sequence + 10 * full.bytes_per_block, 2);
  ASSERT_TRUE(engine);
  EXPECT_EQ(engine->kv_budget().total_blocks, 10);
  const SequenceId a = *engine->add_sequence();
  const auto prompt = text_tokens(*engine, 200);  // 4 blocks
  StepResult result;
  ASSERT_TRUE(engine->step(std::vector<StepItem>{{a, prompt, StepOutput::kLastLogits}}, result).is_ok());
  EXPECT_EQ(*engine->sequence_blocks(a), 4);
  EXPECT_EQ(engine->kv_budget().free_blocks, 6);
  const SequenceId b = *engine->add_sequence();
  const auto long_prompt = text_tokens(*engine, 400);  // 7 blocks: more than the 6 free
  const Status refused = engine->step(std::vector<StepItem>{{b, long_prompt, StepOutput::kLastLogits}}, result);
  EXPECT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("KV budget"), std::string::npos) << refused.message();
  EXPECT_EQ(*engine->num_tokens(b), 0);
  EXPECT_EQ(engine->kv_budget().free_blocks, 6);
  EXPECT_FALSE(engine->add_sequence());  // max_sequences = 2
  ASSERT_TRUE(engine->remove_sequence(a).is_ok());
  EXPECT_EQ(engine->kv_budget().free_blocks, 10);
  EXPECT_TRUE(engine->step(std::vector<StepItem>{{b, long_prompt, StepOutput::kLastLogits}}, result).is_ok());
  EXPECT_FALSE(engine->remove_sequence(a).is_ok());  // gone
}

// A prefill worker's streamed pieces (copies of the KV on their way to a decode worker) stay in the
// budget after their sequence is removed, until the last of them is let go: admission must not give
// that memory again while it is still being sent.
TEST(EngineStep, StreamedPiecesHeldAfterTheirSequenceCountInTheBudget) {
  auto engine = load("hack:bits=2,pi=64");
  ASSERT_TRUE(engine);
  const KvBudget full = engine->kv_budget();
  const SequenceId a = *engine->add_sequence();
  std::vector<KvTransferPiece> pieces;  // what a sender has not sent yet
  ASSERT_TRUE(engine->stream_kv_in_next_step(a, [&](KvTransferPiece piece) { pieces.push_back(std::move(piece)); }));
  const auto prompt = text_tokens(*engine, 200);  // 4 blocks
  StepResult result;
  ASSERT_TRUE(engine->step(std::vector<StepItem>{{a, prompt, StepOutput::kLastLogits}}, result).is_ok());
  ASSERT_EQ(pieces.size(), size_t(engine->model_config().num_layers) + 1);  // the head and every layer
  std::vector<uint8_t> sent;
  for (const KvTransferPiece& piece : pieces) {
    if (piece.layer >= 0) {
      sent.insert(sent.end(), piece.bytes.begin(), piece.bytes.end());
      sent.insert(sent.end(), piece.open.begin(), piece.open.end());
    }
  }
  const int64_t held_blocks = int64_t((sent.size() + full.bytes_per_block - 1) / full.bytes_per_block);
  ASSERT_GT(held_blocks, 0);
  EXPECT_EQ(engine->kv_budget().free_blocks, full.total_blocks - 4 - held_blocks);
  ASSERT_TRUE(engine->remove_sequence(a));
  EXPECT_EQ(engine->kv_budget().free_blocks, full.total_blocks - held_blocks) << "the pieces are still held";
  pieces.resize(pieces.size() / 2);  // half of them sent
  EXPECT_LT(engine->kv_budget().free_blocks, full.total_blocks);
  pieces.clear();
  EXPECT_EQ(engine->kv_budget().free_blocks, full.total_blocks);
}

TEST(EngineStep, BadStepsNameTheItem) {
  auto engine = load("dense");
  ASSERT_TRUE(engine);
  const SequenceId a = *engine->add_sequence();
  const std::vector<int32_t> bad = {5, 8192};
  const std::vector<int32_t> good = {5};
  StepResult result;
  auto message = [&](std::vector<StepItem> items) { return engine->step(items, result).message(); };
  EXPECT_NE(message({{a, good}, {a, good}}).find("twice"), std::string::npos);
  EXPECT_NE(message({{a, bad}}).find("token id 8192 at index 1"), std::string::npos);
  EXPECT_NE(message({{a + 100, good}}).find("sequence 100"), std::string::npos);
  EXPECT_NE(message({{a, {}}}).find("no tokens"), std::string::npos);
  EXPECT_NE(message({}).find("no sequences"), std::string::npos);
  EXPECT_EQ(*engine->num_tokens(a), 0);
  EXPECT_FALSE(engine->add_sequence({.temperature = -1}));
  EXPECT_FALSE(engine->add_sequence({.top_p = 0}));
}

TEST(EngineStep, ExportedKvImportedIntoAnotherEngineContinuesExactly) {
  for (const std::string spec : {"dense", "hack:bits=2,pi=64"}) {
    auto sender = load(spec), receiver = load(spec);
    ASSERT_TRUE(sender && receiver);
    const auto prompt = text_tokens(*sender, 150);
    const std::vector<int32_t> expected = greedy_alone(*sender, prompt, 8);
    const SequenceId a = *sender->add_sequence();
    StepResult result;
    ASSERT_TRUE(sender->step(std::vector<StepItem>{{a, prompt, StepOutput::kSample}}, result).is_ok());
    const int32_t first = result.tokens[0];
    auto transfer = sender->export_kv(a);
    ASSERT_TRUE(transfer) << transfer.status().message();
    const SequenceId b = *receiver->add_sequence();
    ASSERT_TRUE(receiver->import_kv(b, *transfer, "test").is_ok());
    EXPECT_EQ(*receiver->sequence_blocks(b), 3);
    EXPECT_EQ(receiver->kv_budget().free_blocks, receiver->kv_budget().total_blocks - 3);
    std::vector<int32_t> continued = {first};
    for (int i = 1; i < 8; ++i) {
      ASSERT_TRUE(receiver->step(std::vector<StepItem>{{b, std::span(&continued.back(), 1), StepOutput::kSample}}, result).is_ok());
      continued.push_back(result.tokens[0]);
    }
    EXPECT_EQ(continued, expected) << spec;
    // Into a sequence that holds tokens, or from another spec: refused, naming both sides.
    EXPECT_FALSE(receiver->import_kv(b, *transfer, "test").is_ok());
    auto other = load(spec == "dense" ? "hack:bits=2,pi=64" : "dense");
    const Status mismatch = other->import_kv(*other->add_sequence(), *transfer, "test");
    EXPECT_FALSE(mismatch.is_ok());
    EXPECT_NE(mismatch.message().find("spec"), std::string::npos) << mismatch.message();
  }
}

// sinks=N and window=W travel as FP16 rows (KV transfer version 3): whatever the prompt's length against
// the sinks, a block and the window, the importer's next steps give the sender's logits bit for bit.
TEST(EngineStep, SinksAndWindowImportedContinueWithTheSendersLogits) {
  const std::string spec = "hack:bits=2,pi=64,sinks=4,window=64";
  auto sender = load(spec), receiver = load(spec);
  ASSERT_TRUE(sender && receiver);
  for (const int tokens : {3, 30, 64, 100, 128, 150, 192}) {
    SCOPED_TRACE(str_cat(tokens, " prompt tokens"));
    const auto prompt = text_tokens(*sender, tokens);
    const SequenceId a = *sender->add_sequence();
    StepResult result;
    ASSERT_TRUE(sender->step(std::vector<StepItem>{{a, prompt, StepOutput::kNone}}, result).is_ok());
    auto transfer = sender->export_kv(a);
    ASSERT_TRUE(transfer) << transfer.status().message();
    const SequenceId b = *receiver->add_sequence();
    ASSERT_TRUE(receiver->import_kv(b, *transfer, "test").is_ok());
    for (int i = 0; i < 6; ++i) {  // the same tokens into both: each step's logits equal
      const int32_t token = int32_t(100 + 13 * i);
      StepResult sent, imported;
      ASSERT_TRUE(sender->step(std::vector<StepItem>{{a, std::span(&token, 1), StepOutput::kLastLogits}}, sent).is_ok());
      ASSERT_TRUE(receiver->step(std::vector<StepItem>{{b, std::span(&token, 1), StepOutput::kLastLogits}}, imported).is_ok());
      ASSERT_TRUE(std::equal(sent.logits_of(0).begin(), sent.logits_of(0).end(), imported.logits_of(0).begin(),
                             imported.logits_of(0).end()))
          << "step " << i;
    }
    EXPECT_EQ(*receiver->export_kv(b), *sender->export_kv(a));
    ASSERT_TRUE(sender->remove_sequence(a).is_ok());
    ASSERT_TRUE(receiver->remove_sequence(b).is_ok());
  }
}

// A store restored outside the engine (Engine::new_kv_store, as a KV stream's receiver fills it while
// the engine steps) and adopted by a sequence continues as an imported transfer does; a store of another
// engine, a sequence that holds tokens, or a budget without room are refused, leaving everything as it was.
TEST(EngineStep, AnAdoptedStoreContinuesAsAnImportAndIsCounted) {
  const std::string spec = "hack:bits=2,pi=64";
  auto sender = load(spec);
  // A budget of 7 blocks: room for two 150-token sequences (3 blocks each), not for a third.
  auto probe = load(spec, size_t(64) << 20, 4);
  ASSERT_TRUE(sender && probe);
  const KvBudget probed = probe->kv_budget();
  const size_t open_bytes = (size_t(64) << 20) - size_t(probed.total_blocks) * probed.bytes_per_block;
  auto receiver = load(spec, open_bytes + 7 * probed.bytes_per_block, 4);
  ASSERT_TRUE(receiver);
  ASSERT_EQ(receiver->kv_budget().total_blocks, 7);
  const auto prompt = text_tokens(*sender, 150);
  const SequenceId a = *sender->add_sequence();
  StepResult result;
  ASSERT_TRUE(sender->step(std::vector<StepItem>{{a, prompt, StepOutput::kSample}}, result).is_ok());
  const int32_t first = result.tokens[0];
  const std::vector<uint8_t> transfer = *sender->export_kv(a);
  const auto restored = [&](const Engine& engine) {
    std::shared_ptr<KvStore> store = *engine.new_kv_store();
    const auto info = inspect_kv_transfer(transfer.data(), transfer.size(), "test");
    EXPECT_TRUE(info) << info.status().message();
    restore_kv_transfer(transfer.data(), *info, *store);
    return store;
  };
  const SequenceId imported = *receiver->add_sequence(), adopted = *receiver->add_sequence();
  ASSERT_TRUE(receiver->import_kv(imported, transfer, "test").is_ok());
  const Status status = receiver->adopt_kv(adopted, restored(*receiver), "staged");
  ASSERT_TRUE(status.is_ok()) << status.message();
  EXPECT_EQ(*receiver->export_kv(adopted), transfer);
  EXPECT_EQ(*receiver->sequence_blocks(adopted), 3);
  EXPECT_EQ(receiver->kv_budget().free_blocks, 1);
  // The next token's logits: the same bits as after a whole import.
  const std::vector<StepItem> next = {{imported, std::span(&first, 1), StepOutput::kLastLogits},
                                      {adopted, std::span(&first, 1), StepOutput::kLastLogits}};
  ASSERT_TRUE(receiver->step(next, result).is_ok());
  EXPECT_TRUE(std::equal(result.logits_of(0).begin(), result.logits_of(0).end(), result.logits_of(1).begin()));

  // Refused, changing nothing: into a sequence holding tokens, a store of another engine, a budget
  // without room (1 block free, 3 needed).
  EXPECT_NE(receiver->adopt_kv(adopted, restored(*receiver), "staged").message().find("already holds"), std::string::npos);
  const SequenceId c = *receiver->add_sequence();
  EXPECT_NE(receiver->adopt_kv(c, restored(*sender), "foreign").message().find("not a store of this engine"),
            std::string::npos);
  const Status full = receiver->adopt_kv(c, restored(*receiver), "staged");
  EXPECT_NE(full.message().find("3 blocks of the KV budget, 1 are free"), std::string::npos) << full.message();
  EXPECT_EQ(*receiver->num_tokens(c), 0);
  EXPECT_EQ(receiver->kv_budget().free_blocks, 1);
}

}  // namespace
}  // namespace slimkv
