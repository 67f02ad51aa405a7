// The small pieces of slimkv serve: error envelopes, SSE framing, the bearer key, response JSON and the
// Prometheus text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/api_error.h"
#include "serve/auth.h"
#include "serve/metrics.h"
#include "serve/openai_response.h"
#include "serve/sse.h"

namespace slimkv {
namespace {

using nlohmann::json;

TEST(ApiError, HasOpenAisEnvelope) {
  const json body = json::parse(ApiError::bad_field("max_tokens", "max_tokens: must be an integer").body());
  EXPECT_EQ(body["error"]["message"], "max_tokens: must be an integer");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_TRUE(body["error"]["code"].is_null());
  EXPECT_EQ(ApiError::unauthorized().status, 401);
  EXPECT_EQ(ApiError::body_too_large(10).status, 413);
  EXPECT_EQ(ApiError::unavailable("loading").status, 503);
  EXPECT_TRUE(json::parse(ApiError::unavailable("loading").body())["error"]["param"].is_null());
}

TEST(Sse, FramesEventsAndDone) {
  EXPECT_EQ(sse_event(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
}

TEST(BearerKey, MatchesOnlyTheExactKey) {
  EXPECT_TRUE(bearer_key_matches("", ""));
  EXPECT_TRUE(bearer_key_matches("anything", ""));
  EXPECT_TRUE(bearer_key_matches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(bearer_key_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_key_matches("Bearer s3cretX", "s3cret"));
  EXPECT_FALSE(bearer_key_matches("bearer s3cret", "s3cret"));
  EXPECT_FALSE(bearer_key_matches("s3cret", "s3cret"));
  EXPECT_FALSE(bearer_key_matches("", "s3cret"));
}

TEST(OpenAiResponse, CompletionAndChatShapes) {
  const ResponseHeader completion{.chat = false, .id = "cmpl-1", .created = 5, .model = "m"};
  json body = json::parse(completion_json(completion, "hello", FinishReason::kLength, {3, 2}));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "hello");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["total_tokens"], 5);

  const ResponseHeader chat{.chat = true, .id = "chatcmpl-1", .created = 5, .model = "m"};
  body = json::parse(completion_json(chat, "hi", FinishReason::kStop, {3, 1}));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");

  json first = json::parse(chunk_json(chat, "", std::nullopt, true, true));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  json last = json::parse(chunk_json(chat, "", FinishReason::kStop, false, false));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_FALSE(last.contains("usage"));
  json usage = json::parse(usage_chunk_json(completion, {4, 6}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6);
}

TEST(PrometheusText, VllmNamesUnderTheSlimkvPrefixAndCumulativeBuckets) {
  SchedulerStats stats;
  stats.running = 2;
  stats.waiting = 3;
  stats.kv = {.block_tokens = 64, .total_blocks = 10, .free_blocks = 4, .bytes_per_block = 6400};
  stats.prompt_tokens_total = 100;
  stats.time_to_first_token = LatencyHistogram({0.1, 1.0});
  stats.time_to_first_token.observe(0.05);
  stats.time_to_first_token.observe(0.5);
  stats.time_to_first_token.observe(5);
  stats.decode_steps_by_sequences.resize(4);
  stats.decode_steps_by_sequences[3] = {.seconds = 0.5, .count = 20};
  const std::string text = prometheus_text(stats, {.model_name = "m\"x", .kv_spec = "hack:bits=4", .device = "cpu"});
  const auto has = [&](const std::string& line) { EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << "\n" << text; };
  has(R"(slimkv:num_requests_running{model_name="m\"x"} 2)");
  has(R"(slimkv:num_requests_waiting{model_name="m\"x"} 3)");
  has(R"(slimkv:kv_cache_usage_perc{model_name="m\"x"} 0.59999999999999998)");
  has(R"(slimkv:prompt_tokens_total{model_name="m\"x"} 100)");
  has("# TYPE slimkv:time_to_first_token_seconds histogram");
  has(R"(slimkv:time_to_first_token_seconds_bucket{model_name="m\"x",le="0.10000000000000001"} 1)");
  has(R"(slimkv:time_to_first_token_seconds_bucket{model_name="m\"x",le="1"} 2)");
  has(R"(slimkv:time_to_first_token_seconds_bucket{model_name="m\"x",le="+Inf"} 3)");
  has(R"(slimkv:time_to_first_token_seconds_count{model_name="m\"x"} 3)");
  has(R"(slimkv:kv_cache_bytes_per_token{model_name="m\"x"} 100)");
  has(R"(slimkv:kv_cache_used_bytes{model_name="m\"x",tier="cpu"} 38400)");
  has(R"(slimkv:kv_cache_info{model_name="m\"x",kv_spec="hack:bits=4",device="cpu"} 1)");
  has("# TYPE slimkv:decode_step_seconds summary");
  has(R"(slimkv:decode_step_seconds_sum{model_name="m\"x",sequences="3"} 0.5)");
  has(R"(slimkv:decode_step_seconds_count{model_name="m\"x",sequences="3"} 20)");
  EXPECT_EQ(text.find(R"(sequences="2")"), std::string::npos) << "a batch size with no steps";
  for (const char* name : {"num_preemptions_total", "generation_tokens_total", "inter_token_latency_seconds_count",
                           "e2e_request_latency_seconds_sum", "request_success_total", "engine_step_seconds_count",
                           "scheduler_between_steps_seconds_bucket"}) {
    EXPECT_NE(text.find(std::string("slimkv:") + name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace slimkv
