// The GPU's host KV tiers (kv/cuda/host_kv_tier.h, issue 11): `offload` streams every token's
// K/V from pinned host memory, `kvpr` recomputes part of it from the kept attention inputs X. Both
// must give the logits of the all-resident `dense` cache: offload moves the same FP16 bytes, kvpr's
// recomputed K/V come from the same FP16 X through a GEMM of another shape (W_k|W_v alone, other row
// counts), whose FP32 sums may round a K/V element to the neighbouring FP16 value: 1e-3 of max |logit|
// bounds that on the bundled model, as for batches against single sequences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cuda_test_util.h"
#include "golden_models.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

using CudaTierTest = CudaTest;

struct StepLogits {
  std::vector<std::vector<float>> logits;  // per step, [batch, vocab]
};

// Prompts of 1, 63, 64 and 130 tokens in one step (partial blocks, a full one, several), then three
// batched decode steps; the logits of every step.
Expected<StepLogits> run_batch(const LlamaModel& cpu_model, const CudaModelOptions& options, double* fraction = nullptr) {
  SLIMKV_ASSIGN_OR_RETURN(auto model, CudaLlamaModel::upload(cpu_model.config(), cpu_model.weights(), options));
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, int32_t(cpu_model.config().vocab_size) - 1);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> ids;
  for (int n : {1, 63, 64, 130}) {
    prompts.emplace_back(size_t(n));
    for (int32_t& t : prompts.back()) t = id(rng);
    SLIMKV_ASSIGN_OR_RETURN(int s, model->add_sequence());
    ids.push_back(s);
  }
  StepLogits run;
  std::vector<SequenceTokens> step;
  for (size_t i = 0; i < ids.size(); ++i) step.push_back({ids[i], prompts[i]});
  std::vector<float> logits;
  SLIMKV_RETURN_IF_ERROR(model->step(step, false, logits));
  run.logits.push_back(logits);
  for (int t = 0; t < 3; ++t) {
    const std::vector<int32_t> next = {int32_t(11 + t)};
    step.clear();
    for (int s : ids) step.push_back({s, next});
    SLIMKV_RETURN_IF_ERROR(model->step(step, false, logits));
    run.logits.push_back(logits);
  }
  // A prefill chunk of 70 tokens each, after what the sequences hold: with a quantized codec it reads
  // their sealed blocks.
  const std::vector<int32_t> chunk(70, 7);
  step.clear();
  for (int s : ids) step.push_back({s, chunk});
  SLIMKV_RETURN_IF_ERROR(model->step(step, false, logits));
  run.logits.push_back(logits);
  if (fraction != nullptr) *fraction = model->last_recompute_fraction();
  return run;
}

CudaModelOptions base_options() {
  CudaModelOptions options;
  options.max_sequences = 4;
  options.max_step_tokens = 512;
  options.max_context_tokens = 1024;
  return options;
}

TEST_F(CudaTierTest, OffloadAndKvprGiveTheLogitsOfResidentDenseForAnySplitAndSchedule) {
  auto cpu_model = take(LlamaModel::load(kBundled));
  const StepLogits resident = take(run_batch(*cpu_model, base_options()));
  struct Case {
    bool recompute;
    double split;
    int micro_batches;
    size_t kv_cache_bytes;
  };
  // 64 KB per block of K|V of one layer here; 5 blocks per staging buffer make the column schedule
  // cut the 4 sequences (1 + 2 + 2 + 3 blocks after the decode steps) into micro-batches.
  const size_t five_blocks = 2 * 5 * 65536;
  const std::vector<Case> cases = {{false, 0, 1, 0},         {true, 0, 1, 0},    {true, 0.3, 1, 0},
                                   {true, 0.5, 1, 0},        {true, 1, 1, 0},    {false, 0, 0, five_blocks},
                                   {true, 0.5, 0, five_blocks}, {true, 1, 3, five_blocks}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << (c.recompute ? "kvpr split " : "offload ") << c.split << ", micro-batches "
                                    << c.micro_batches << ", GPU KV bytes " << c.kv_cache_bytes);
    CudaModelOptions options = base_options();
    options.kv_cache_bytes = c.kv_cache_bytes;
    options.tier = KvTierOptions{c.recompute, c.split, c.micro_batches};
    const StepLogits tiered = take(run_batch(*cpu_model, options));
    ASSERT_EQ(tiered.logits.size(), resident.logits.size());
    for (size_t step = 0; step < resident.logits.size(); ++step) {
      EXPECT_LT(relative_max_error(tiered.logits[step], resident.logits[step]), 1e-3) << "step " << step;
    }
  }
}

// hack / quant blocks in the tiers: steps move sealed blocks and attend through them (decode: the open
// block in FP16; a prefill chunk: the blocks from the one it starts in), recomputed and filled blocks
// are sealed on the GPU. Offload seals the same FP16 K/V
// into the same bytes as the resident quantized cache; kvpr's recomputed K/V may differ by an FP16
// rounding, which can flip a code: its logits must still be far closer to the resident codec's than
// the codec's are to dense.
TEST_F(CudaTierTest, QuantizedBlocksInTheTiersDecodeLikeTheResidentCodec) {
  auto cpu_model = take(LlamaModel::load(kBundled));
  const StepLogits dense = take(run_batch(*cpu_model, base_options()));
  for (const bool hack : {true, false}) {
    for (const int bits : {2, 4}) {
      CudaModelOptions quantized = base_options();
      QuantizationConfig config;
      config.k_bits = config.v_bits = bits;
      quantized.quantized_kv = QuantizedKvOptions{config, hack, 7};
      const StepLogits resident = take(run_batch(*cpu_model, quantized));
      struct Case {
        bool recompute;
        double split;
        int micro_batches;
      };
      for (const Case& c : std::vector<Case>{{false, 0, 1}, {true, 0.5, 1}, {true, 1, 3}}) {
        SCOPED_TRACE(testing::Message() << (hack ? "hack " : "quant ") << bits << " bits, "
                                        << (c.recompute ? "kvpr split " : "offload ") << c.split << ", micro-batches "
                                        << c.micro_batches);
        CudaModelOptions options = quantized;
        options.tier = KvTierOptions{c.recompute, c.split, c.micro_batches};
        const StepLogits tiered = take(run_batch(*cpu_model, options));
        for (size_t step = 1; step < resident.logits.size(); ++step) {  // the decode steps and the chunk
          const double to_resident = relative_max_error(tiered.logits[step], resident.logits[step]);
          const double codec_to_dense = relative_max_error(resident.logits[step], dense.logits[step]);
          if (!c.recompute) {
            EXPECT_LT(to_resident, 1e-3) << "step " << step;
          } else {
            EXPECT_LT(to_resident, 0.25 * codec_to_dense) << "step " << step;
          }
          std::printf("%s %d-bit %s split %.1f step %zu: vs resident codec %.2e (codec vs dense %.2e)\n",
                      hack ? "hack" : "quant", bits, c.recompute ? "kvpr" : "offload", c.split, step, to_resident,
                      codec_to_dense);
        }
      }
    }
  }
}

// The automatic split is the cost model's best l over the step's held tokens (Eq. 10, closed form).
TEST_F(CudaTierTest, AutomaticSplitFollowsTheCostModel) {
  auto cpu_model = take(LlamaModel::load(kBundled));
  for (const auto& [link, gemm] : std::vector<std::pair<double, double>>{{50e9, 400e12}, {50e9, 1e9}, {1e15, 400e12}}) {
    CudaModelOptions options = base_options();
    options.tier = KvTierOptions{true, -1, 1, 0, link, gemm};
    double fraction = -1;
    take(run_batch(*cpu_model, options, &fraction));
    // The last step's sequences held 1+3, 63+3, 64+3 and 130+3 tokens.
    const KvprCostModel cost =
        kvpr_cost_model(cpu_model->config(), DType::kF16, 4.0 * double(cpu_model->config().kv_dim()), link, gemm);
    const long held = 4 + 66 + 67 + 133;
    EXPECT_NEAR(fraction, double(cost.best_split_by_sweep(held)) / double(held), 1e-12) << link << " " << gemm;
  }
}

TEST_F(CudaTierTest, StepsBeyondTheBudgetsAreRefusedAndChangeNothing) {
  auto cpu_model = take(LlamaModel::load(kBundled));
  CudaModelOptions options = base_options();
  options.kv_cache_bytes = 2 * 2 * 65536;  // 2 blocks per staging buffer
  options.tier = KvTierOptions{true, 0.5, 1};
  auto model = take(CudaLlamaModel::upload(cpu_model->config(), cpu_model->weights(), options));
  const int a = take(model->add_sequence()), b = take(model->add_sequence());
  const std::vector<int32_t> prompt(100, 3), longer(200, 3);
  std::vector<float> logits;
  SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{a, prompt}}, false, logits));
  // Row by row stages the whole batch: 2 + 2 blocks do not fit a buffer of 2.
  Status status = model->step(std::vector<SequenceTokens>{{a, prompt}, {b, prompt}}, false, logits);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("staging buffer"), std::string::npos) << status.message();
  // One sequence over a buffer: refused whatever the schedule.
  status = model->step(std::vector<SequenceTokens>{{b, longer}}, false, logits);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("sequence " + std::to_string(b)), std::string::npos) << status.message();
  EXPECT_EQ(model->num_tokens(a), 100);
  EXPECT_EQ(model->num_tokens(b), 0);
  // The host pool: room for 4 blocks of every layer.
  options.kv_cache_bytes = 0;
  const ModelConfig& c = cpu_model->config();
  options.tier->host_bytes = 4 * 64 * size_t(c.num_layers) * size_t(4 * c.kv_dim() + 2 * c.hidden_size);
  model = take(CudaLlamaModel::upload(cpu_model->config(), cpu_model->weights(), options));
  const int s = take(model->add_sequence());
  SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{s, longer}}, false, logits));
  status = model->step(std::vector<SequenceTokens>{{s, longer}}, false, logits);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("host KV cache is full"), std::string::npos) << status.message();
  EXPECT_EQ(model->num_tokens(s), 200);
  // A host pool larger than the machine's RAM (a petabyte) is refused at once, naming the sizes.
  options.tier->host_bytes = size_t(1) << 50;
  const auto huge = CudaLlamaModel::upload(cpu_model->config(), cpu_model->weights(), options);
  ASSERT_FALSE(huge.has_value());
  EXPECT_NE(huge.status().message().find("bytes of RAM"), std::string::npos) << huge.status().message();
}

// Through the engine and the KV spec: greedy generation with `@offload` and `@kvpr` is the resident
// cache's, for dense and hack.
TEST_F(CudaTierTest, EngineGreedyTokensWithTiersAreDenses) {
  const auto generate = [](const std::string& kv) {
    EngineConfig config;
    config.model_dir = kBundled;
    config.kv_spec = kv;
    config.device = "cuda";
    config.prefill_chunk_tokens = 256;
    config.max_sequences = 2;
    auto engine = take(Engine::load(config));
    std::vector<int32_t> prompt(700);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 11) % 8000);
    return take(greedy_continuation(*engine->new_session(), prompt, 24));
  };
  const std::vector<int32_t> dense = generate("dense");
  EXPECT_EQ(generate("dense@offload"), dense);
  EXPECT_EQ(generate("dense@kvpr:split=0.5"), dense);
  EXPECT_EQ(generate("dense@kvpr:split=1,schedule=column"), dense);
  // hack with its defaults (rot=hadamard: the recomputed K/V are rotated as the appended ones).
  const std::vector<int32_t> hack = generate("hack:bits=4");
  EXPECT_EQ(generate("hack:bits=4@offload"), hack);
  EXPECT_EQ(generate("hack:bits=4@kvpr:split=1"), hack);
}

}  // namespace
}  // namespace slimkv::cuda
