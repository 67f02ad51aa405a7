// The bundled model through the whole engine: tokenizer.json, sharded BF16 weights, and the KV
// codecs on a long-context retrieval prompt (a pass key hidden at 40% of ~1800 tokens of held-out text,
// models/slimkv-llama-15m/passkey_prompt.*). The plain reference (scripts/train/reference_cpu.py: a Python
// BPE encoder and an FP32 PyTorch forward) wrote passkey_prompt.json: how many tokens it encoded the prompt
// to and the key it answered; slimkv must agree on both.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"

#include "sanitizer.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

// What the plain reference recorded for the prompt: its token count (with BOS) and the expected answer.
const nlohmann::json& reference() {
  static const nlohmann::json json = nlohmann::json::parse(std::ifstream(kModel + "/passkey_prompt.json"));
  return json;
}

std::string expected_answer() { return reference().at("expected_answer").get<std::string>(); }

std::string greedy_answer(const std::string& kv_spec, int tokens) {
  EngineConfig config;
  config.model_dir = kModel;
  config.kv_spec = kv_spec;
  config.threads = 2;
  auto engine = Engine::load(config);
  EXPECT_TRUE(engine) << engine.status().message();
  if (!engine) return "";
  std::ifstream in(kModel + "/passkey_prompt.txt");
  std::stringstream prompt;
  prompt << in.rdbuf();
  const Tokenizer& tokenizer = *(*engine)->tokenizer();
  const std::vector<int32_t> ids = tokenizer.encode(prompt.str());
  EXPECT_EQ(ids.size(), reference().at("prompt_tokens").get<size_t>())
      << "the prompt must encode as the reference encoded it";
  auto session = (*engine)->new_session();
  auto logits = session->prefill(ids);
  std::vector<int32_t> answer;
  for (int i = 0; i < tokens && logits; ++i) {
    answer.push_back(int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin()));
    logits = session->decode(answer.back());
  }
  return tokenizer.decode(answer);
}

// Under ASan+UBSan (~3.5x slower than release on the model) the dense and hack answers are left to the release
// build: they test the answer, and the same paths are checked for memory errors there by HfParity (the
// forward pass, prefill, incremental and chunked), the hack codec and kernel tests, and the pq test
// below (this prompt through the engine, with a hack:bits=4 codec). docs/testing.md: "CI time".

TEST(BundledModel, DenseRetrievesThePassKeyAsTheReferenceDoes) {
  SKIP_UNDER_ASAN("quality only");
  EXPECT_EQ(greedy_answer("dense", 6).substr(0, expected_answer().size()), expected_answer());
}

TEST(BundledModel, HackFourBitStaysCoherentAndRetrievesThePassKey) {
  SKIP_UNDER_ASAN("quality only");
  EXPECT_EQ(greedy_answer("hack:bits=4,pi=64", 6).substr(0, expected_answer().size()), expected_answer());
}

// PQCache's main setting (1/5 of the tokens) composed with a codec and the offload tier; slimkv eval
// measures pq over many prompts (docs/results/pq/README.md).
TEST(BundledModel, PqAtOneFifthOfTokensFromTheOffloadTierRetrievesThePassKey) {
  EXPECT_EQ(greedy_answer("pq:m=2,b=6,topk=0.2+hack:bits=4,round=stochastic@offload:cache=1024", 6)
                .substr(0, expected_answer().size()),
            expected_answer());
}

}  // namespace
}  // namespace slimkv
