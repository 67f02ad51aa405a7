// The bundled model through the whole engine: tokenizer.json, sharded BF16 weights, and the KV
// codecs on a long-context retrieval prompt (a pass key hidden at 40% of ~1800 tokens of held-out text,
// models/slimkv-llama-15m/passkey_prompt.*). The plain reference (scripts/train/reference_cpu.py: a Python
// BPE encoder and an FP32 PyTorch forward) encodes it to 1818 tokens and answers " 52445.".
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"

#include "sanitizer.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

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
  EXPECT_EQ(ids.size(), 1818u) << "the prompt must encode as the reference encoded it";
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
  EXPECT_EQ(greedy_answer("dense", 6).substr(0, 6), " 52445");
}

TEST(BundledModel, HackFourBitStaysCoherentAndRetrievesThePassKey) {
  SKIP_UNDER_ASAN("quality only");
  EXPECT_EQ(greedy_answer("hack:bits=4,pi=64", 6).substr(0, 6), " 52445");
}

// PQCache's main setting (1/5 of the tokens) composed with a codec and the offload tier. The answer
// sits on a knife edge for this prompt: at 1/10 of the tokens storing the open block in FP16 instead
// of FP32 flipped its fourth digit, and at 1/5 so does nearest rounding with exact prefill (the
// defaults since; " 52448", while seed=1 or rot=none give " 52445"). So the codec here keeps the
// rounding the test was written with; slimkv eval measures pq over many prompts instead (docs/results/pq/README.md).
TEST(BundledModel, PqAtOneFifthOfTokensFromTheOffloadTierRetrievesThePassKey) {
  EXPECT_EQ(greedy_answer("pq:m=2,b=6,topk=0.2+hack:bits=4,round=stochastic@offload:cache=1024", 6).substr(0, 6),
            " 52445");
}

}  // namespace
}  // namespace slimkv
