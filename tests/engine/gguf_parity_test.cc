// GGUF files made by llama.cpp's converter and llama-quantize (scripts/gguf/make_fixtures.py) against
// llama.cpp's own logits on the same files, prefill and token by token, and their tokenizers against
// llama.cpp's and Hugging Face tokenizers' ids.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gguf_fixtures.h"
#include "golden_models.h"
#include "model/model_config.h"
#include "slimkv/engine.h"
#include "slimkv/npy.h"
#include "slimkv/tokenizer.h"
#include "tokenizer/gguf_tokenizer.h"
#include "util/half.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string& kDir = slimkv::test::kGgufDir;
using slimkv::test::read_f32;

nlohmann::json manifest() { return slimkv::test::gguf_manifest(); }

std::unique_ptr<Engine> load(const std::string& path) {
  EngineConfig config;
  config.model_dir = path;
  config.threads = 2;
  auto engine = Engine::load(config);
  EXPECT_TRUE(engine) << engine.status().message();
  return engine ? engine.take() : nullptr;
}

// Both engines compute from the same stored weights; what differs is the activations: llama.cpp's
// CPU kernels round them to F16 (F16 weights) or quantize them to 8 bits (quantized weights) before
// each product; slimkv keeps FP32 for F16 weights and for prefill, and quantizes decode's inputs to 8
// bits as llama.cpp does (backend/cpu/quant_dot.h) — which inputs round across a step differs once the
// two runs' activations differ slightly. So F16 files agree within FP16 rounding, and quantized files
// within the quantization's own error: llama.cpp's distance from its logits on the model's F16 file
// (measured per file, printed; the same on every quant_dot tier). Relative to max |logit|.
constexpr double kF16Tolerance = 5e-3;

TEST(GgufParity, LogitsMatchLlamaCppInPrefillAndIncrementalModes) {
  const nlohmann::json m = manifest();
  const std::vector<int32_t> tokens = m["tokens"].get<std::vector<int32_t>>();
  ASSERT_GE(m["models"].size(), 5u);
  for (const auto& [file, entry] : m["models"].items()) {
    SCOPED_TRACE(file);
    auto engine = load(kDir + "/" + file);
    ASSERT_TRUE(engine);
    const std::vector<float> golden = read_f32(kDir + "/" + entry["logits"].get<std::string>());
    ASSERT_EQ(golden.size(), tokens.size() * size_t(engine->model_config().vocab_size));
    auto prefill = engine->new_session()->prefill(tokens, /*all_logits=*/true);
    ASSERT_TRUE(prefill) << prefill.status().message();
    auto session = engine->new_session();
    std::vector<float> incremental;
    for (int32_t id : tokens) {
      auto row = session->decode(id);
      ASSERT_TRUE(row) << row.status().message();
      incremental.insert(incremental.end(), row->begin(), row->end());
    }
    const double quantization_error =
        relative_max_error(golden, read_f32(kDir + "/" + entry["f16_logits"].get<std::string>()));
    const double tolerance = entry["type"] == "F16" ? kF16Tolerance : quantization_error;
    const double prefill_error = relative_max_error(*prefill, golden);
    const double incremental_error = relative_max_error(incremental, golden);
    EXPECT_LT(prefill_error, tolerance);
    EXPECT_LT(incremental_error, tolerance);
    std::printf("%s: max error / max|logit| vs llama.cpp: prefill %.2e, incremental %.2e (the quantization's own: %.2e)\n",
                file.c_str(), prefill_error, incremental_error, quantization_error);
  }
}

TEST(GgufParity, TokenizerFromMetadataMatchesLlamaCppAndTokenizerJson) {
  const nlohmann::json m = manifest();
  ASSERT_EQ(m["tokenizers"].size(), 2u);
  for (const auto& [file, entry] : m["tokenizers"].items()) {
    SCOPED_TRACE(file);
    auto from_gguf = load_gguf_tokenizer(kDir + "/" + file);
    ASSERT_TRUE(from_gguf) << from_gguf.status().message();
    const std::string source = slimkv::test::source_dir() + "/tests/data/tokenizers/" + entry["source"].get<std::string>();
    auto from_json = Tokenizer::load(source + "/tokenizer.json");
    ASSERT_TRUE(from_json) << from_json.status().message();
    std::ifstream golden_in(source + "/golden.json");
    const nlohmann::json golden = nlohmann::json::parse(golden_in);  // Hugging Face tokenizers' ids
    ASSERT_EQ(entry["llama_cpp_ids"].size(), golden.size());
    size_t llama_cpp_departures = 0;
    for (size_t i = 0; i < golden.size(); ++i) {
      const std::string text = golden[i]["text"].get<std::string>();
      SCOPED_TRACE(text);
      const std::vector<int32_t> ids = from_gguf->encode(text, /*add_special_tokens=*/false);
      const auto hf_ids = golden[i]["ids_no_special"].get<std::vector<int32_t>>();
      const auto llama_cpp_ids = entry["llama_cpp_ids"][i].get<std::vector<int32_t>>();
      EXPECT_EQ(ids, hf_ids) << "HF tokenizers";
      // llama.cpp itself departs from HF tokenizers on some texts (it has no NFC normalizer for qwen2):
      // there slimkv follows HF; everywhere else the three agree.
      if (llama_cpp_ids != hf_ids) {
        ++llama_cpp_departures;
        std::printf("%s: llama.cpp departs from HF tokenizers on text %zu\n", file.c_str(), i);
      } else {
        EXPECT_EQ(ids, llama_cpp_ids) << "llama.cpp";
      }
      EXPECT_EQ(ids, from_json->encode(text, false)) << "tokenizer.json";
      EXPECT_EQ(from_gguf->encode(text, true), from_json->encode(text, true)) << "with special tokens";
      EXPECT_EQ(from_gguf->decode(ids), from_json->decode(ids));
    }
    EXPECT_LE(llama_cpp_departures, 2u);  // the texts built to show normalization
  }
}

// The F16 files of the Qwen3, Qwen3-MoE and Gemma 3 fixtures against the same weights as a Hugging Face
// checkpoint, independently of llama.cpp: transformers' own logits (a golden model of tests/data/models)
// or slimkv's safetensors path (held to transformers by hf_parity_test). This checks that what the
// converter changed is undone: Gemma's norms stored as 1 + w, its sandwich norms' names, the stacked
// experts. The files were converted from BF16 weights, which F16 holds exactly, so the bar is
// hf_parity_test's own, save for one difference by design: a Gemma 3 GGUF scales the embeddings by
// √hidden in F32 (as llama.cpp), its checkpoint by √hidden rounded to BF16 (as transformers). The
// residual stream then starts that rounding (δ, relative) apart, and the logits may differ by about as
// much: the bar grows by 2δ there.
double embedding_scale_rounding(const ModelConfig& gguf, const ModelConfig& checkpoint) {
  if (!gguf.scale_embeddings || gguf.embedding_scale_in_dtype == checkpoint.embedding_scale_in_dtype) return 0;
  const float scale = std::sqrt(float(checkpoint.hidden_size));
  const float rounded = checkpoint.dtype == DType::kBF16  ? bf16_to_float(float_to_bf16(scale))
                        : checkpoint.dtype == DType::kF16 ? fp16_to_float(float_to_fp16(scale))
                                                          : scale;
  return std::abs(double(rounded) - double(scale)) / double(scale);
}

TEST(GgufParity, F16FilesMatchTheirHuggingFaceCheckpoint) {
  const nlohmann::json m = manifest();
  int checked = 0;
  for (const auto& [file, entry] : m["models"].items()) {
    if (!entry.contains("transformers_golden") && !entry.contains("hf_checkpoint")) continue;
    SCOPED_TRACE(file);
    auto engine = load(kDir + "/" + file);
    ASSERT_TRUE(engine);
    std::vector<int32_t> tokens;
    std::vector<float> golden;
    double bar = 1e-4;
    if (entry.contains("transformers_golden")) {
      const std::string dir = std::string(SLIMKV_SOURCE_DIR) + "/" + entry["transformers_golden"].get<std::string>();
      tokens = golden_tokens(dir);
      auto npy = read_npy_f32(dir + "/golden_logits.npy");
      ASSERT_TRUE(npy) << npy.status().message();
      golden = npy->values;
    } else {
      tokens = m["tokens"].get<std::vector<int32_t>>();
      auto checkpoint = load(std::string(SLIMKV_SOURCE_DIR) + "/" + entry["hf_checkpoint"].get<std::string>());
      ASSERT_TRUE(checkpoint);
      auto logits = checkpoint->new_session()->prefill(tokens, /*all_logits=*/true);
      ASSERT_TRUE(logits) << logits.status().message();
      golden = *logits;
      bar += 2 * embedding_scale_rounding(engine->model_config(), checkpoint->model_config());
    }
    auto prefill = engine->new_session()->prefill(tokens, /*all_logits=*/true);
    ASSERT_TRUE(prefill) << prefill.status().message();
    ASSERT_EQ(prefill->size(), golden.size());
    const double prefill_error = relative_max_error(*prefill, golden);
    EXPECT_LT(prefill_error, bar);
    std::printf("%s: max error / max|logit| vs %s: %.2e (bar %.2e)\n", file.c_str(),
                entry.contains("transformers_golden") ? "transformers" : "its safetensors checkpoint", prefill_error, bar);
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

// SentencePiece tokenizers from GGUF metadata (model "llama": a Llama-2-style vocabulary with a space
// prefix, the same with runs of 8 merges of equal score, and the Gemma 3 fixture's without a prefix)
// against sentencepiece's own ids for the same model and llama.cpp's on the same file: texts with
// unicode (byte fallback), digits, leading and repeated spaces, newlines and tabs. Where scores tie,
// both merge the leftmost pair first; the same merges ranked by their place in the list (the
// tokenizer.json without "merge_ranks") must depart from them there, or the file tests no tie.
TEST(GgufParity, SentencePieceTokenizerMatchesSentencePieceAndLlamaCpp) {
  const nlohmann::json m = manifest();
  const nlohmann::json& spm = m["spm_tokenizers"];
  const auto texts = spm["texts"].get<std::vector<std::string>>();
  ASSERT_GE(texts.size(), 20u);
  int files = 0;
  for (const auto& [file, entry] : spm.items()) {
    if (file == "texts") continue;
    SCOPED_TRACE(file);
    auto tokenizer = load_gguf_tokenizer(kDir + "/" + file);
    ASSERT_TRUE(tokenizer) << tokenizer.status().message();
    auto gguf = GgufFile::open(kDir + "/" + file);
    ASSERT_TRUE(gguf) << gguf.status().message();
    auto json = gguf_tokenizer_json(*gguf);
    ASSERT_TRUE(json) << json.status().message();
    nlohmann::json untied = nlohmann::json::parse(*json);
    untied["model"].erase("merge_ranks");
    auto list_order = Tokenizer::from_json(untied.dump(), file + " without merge_ranks");
    ASSERT_TRUE(list_order) << list_order.status().message();
    size_t byte_fallbacks = 0, sentencepiece_departures = 0, list_order_departures = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      SCOPED_TRACE(texts[i]);
      const std::vector<int32_t> ids = tokenizer->encode(texts[i], /*add_special_tokens=*/false);
      list_order_departures += list_order->encode(texts[i], false) != entry["llama_cpp_ids"][i].get<std::vector<int32_t>>();
      const auto sentencepiece_ids = entry["sentencepiece_ids"][i].get<std::vector<int32_t>>();
      EXPECT_EQ(ids, entry["llama_cpp_ids"][i].get<std::vector<int32_t>>()) << "llama.cpp";
      // sentencepiece reads special tokens in the text as plain text; llama.cpp (and HF's tokenizer.json
      // of such models) match them, and so does slimkv. Elsewhere all three agree.
      if (sentencepiece_ids != entry["llama_cpp_ids"][i].get<std::vector<int32_t>>()) {
        ++sentencepiece_departures;
        std::printf("%s: sentencepiece departs from llama.cpp on text %zu (special tokens in the text)\n", file.c_str(), i);
        continue;
      }
      EXPECT_EQ(ids, sentencepiece_ids) << "sentencepiece";
      if (texts[i].find("▁") == std::string::npos) {  // a literal ▁ decodes to a space
        EXPECT_EQ(tokenizer->decode(ids), texts[i]);
      }
      for (int32_t id : ids) byte_fallbacks += tokenizer->token_text(id).value_or("").starts_with("<0x");
    }
    EXPECT_LE(sentencepiece_departures, 1u);  // the one text of special tokens
    EXPECT_GT(byte_fallbacks, 0u);            // the texts reach characters the vocabulary lacks
    // Merge scores are distinct in trained vocabularies, so only the tied file needs the ranks.
    if (file.find("ties") != std::string::npos) {
      EXPECT_GT(list_order_departures, 0u);
    } else {
      EXPECT_EQ(list_order_departures, 0u);
    }
    std::printf("%s: merges in list order (ties broken by token id) depart from llama.cpp on %zu of %zu texts\n",
                file.c_str(), list_order_departures, texts.size());
    const std::vector<int32_t> with_bos = tokenizer->encode("Hello", /*add_special_tokens=*/true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(tokenizer->token_text(with_bos[0]).value_or(""), file.starts_with("gemma3") ? "<bos>" : "<s>");
    ++files;
  }
  EXPECT_EQ(files, 3);
}

}  // namespace
}  // namespace slimkv
