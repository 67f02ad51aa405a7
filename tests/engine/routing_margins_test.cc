// The routing of Qwen3-MoE's sparse layers as a ForwardObserver sees it on the CPU (model/
// forward_observer.h on_routing): each token's probabilities over the experts, every sparse layer, every
// call; and tests/routing_margins.h finding the closest call of a prompt — the near tie that issue 29's
// GPU comparison fell on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gguf_fixtures.h"
#include "model/model_config.h"
#include "routing_margins.h"
#include "slimkv/engine.h"

namespace slimkv {
namespace {

// RoutingMargins, also counting each layer's tokens and checking that each token's probabilities are one.
class CheckedRouting : public test::RoutingMargins {
 public:
  CheckedRouting(int num_experts, int experts_per_token)
      : RoutingMargins(num_experts, experts_per_token), experts_(num_experts) {}
  void on_routing(int layer, const float* probabilities, int n) override {
    if (size_t(layer) >= tokens.size()) tokens.resize(size_t(layer) + 1, 0);
    tokens[size_t(layer)] += n;
    for (int t = 0; t < n; ++t) {
      double sum = 0;
      for (int e = 0; e < experts_; ++e) sum += probabilities[size_t(t) * size_t(experts_) + size_t(e)];
      EXPECT_NEAR(sum, 1.0, 1e-5) << "layer " << layer << " token " << t;
    }
    RoutingMargins::on_routing(layer, probabilities, n);
  }
  std::vector<int> tokens;  // per layer

 private:
  int experts_;
};

TEST(RoutingMargins, TheObserverSeesEachSparseLayersRoutingAndTheClosestCall) {
  EngineConfig config;
  config.model_dir = test::kGgufDir + "/qwen3moe_tiny-Q8_0.gguf";
  config.threads = 2;
  auto engine = Engine::load(config);
  ASSERT_TRUE(engine) << engine.status().message();
  const ModelConfig& c = (*engine)->model_config();
  ASSERT_EQ(c.moe.num_experts, 4);
  ASSERT_EQ(c.moe.experts_per_token, 2);
  CheckedRouting routing(int(c.moe.num_experts), int(c.moe.experts_per_token));
  auto session = (*engine)->new_session();
  ASSERT_TRUE(session->set_observer(&routing).is_ok());

  // The prompt GgufCuda.ExpertsTakeTheFilesBytes ran until issue 29's search: its closest call is row 4 of
  // layer 1, experts 3 and 0 at probabilities 0.09936 and 0.09918.
  std::vector<int32_t> prompt(20);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 5) % size_t(c.vocab_size));
  ASSERT_TRUE(session->prefill(prompt, /*all_logits=*/false));
  const auto decoded = session->decode(1);  // a second call: its token is row 20
  ASSERT_TRUE(decoded) << decoded.status().message();

  int sparse_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_sparse(l)) continue;
    ++sparse_layers;
    ASSERT_GT(routing.tokens.size(), size_t(l));
    EXPECT_EQ(routing.tokens[size_t(l)], 21) << "layer " << l;
  }
  EXPECT_EQ(routing.routed(), 21 * sparse_layers);
  const test::RoutingMargin& closest = routing.smallest();
  EXPECT_EQ(closest.layer, 1);
  EXPECT_EQ(closest.row, 4);
  EXPECT_NEAR(closest.log_odds, 1.8e-3, 2e-4);
}

}  // namespace
}  // namespace slimkv
