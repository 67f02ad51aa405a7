// /v1/completions and /v1/chat/completions bodies: every bad field is refused with a message naming it.
#include <gtest/gtest.h>

#include "serve/completion_request.h"

namespace slimkv {
namespace {

// Parses a body that must be refused; returns the error.
ApiError refused(const std::string& body, bool chat = false) {
  CompletionRequest request;
  std::optional<ApiError> error = parse_completion_request(body, chat, request);
  EXPECT_TRUE(error.has_value()) << body;
  return error.value_or(ApiError{});
}

struct BadBody {
  std::string body;
  std::string param;  // the field the error must name
};

TEST(CompletionRequest, EachBadFieldIsNamed) {
  const std::vector<BadBody> cases = {
      {R"({"prompt": "hi", "max_tokens": -1})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": 99999999999})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": "16"})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": 1.5})", "max_tokens"},
      {R"({"prompt": "hi", "temperature": 3})", "temperature"},
      {R"({"prompt": "hi", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "hi", "top_p": 0})", "top_p"},
      {R"({"prompt": "hi", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "hi", "top_k": -2})", "top_k"},
      {R"({"prompt": "hi", "seed": "x"})", "seed"},
      {R"({"prompt": "hi", "n": 2})", "n"},
      {R"({"prompt": "hi", "stop": 5})", "stop"},
      {R"({"prompt": "hi", "stop": [""]})", "stop"},
      {R"({"prompt": "hi", "stream": "yes"})", "stream"},
      {R"({"prompt": "hi", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "hi", "stream": true, "stream_options": {"include_usage": 1}})", "stream_options.include_usage"},
      {R"({"prompt": "hi", "echo": true})", "echo"},
      {R"({"prompt": "hi", "best_of": 3})", "best_of"},
      {R"({"prompt": "hi", "logprobs": 5})", "logprobs"},
      {R"({"prompt": "hi", "presence_penalty": 0.5})", "presence_penalty"},
      {R"({"prompt": "hi", "logit_bias": {"5": 10}})", "logit_bias"},
      {R"({"prompt": "hi", "model": 7})", "model"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": ""})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1, -3]})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"max_tokens": 4})", "prompt"},
  };
  for (const BadBody& c : cases) {
    const ApiError error = refused(c.body);
    EXPECT_EQ(error.status, 400) << c.body;
    EXPECT_EQ(error.param, c.param) << c.body << " -> " << error.message;
    EXPECT_NE(error.message.find(c.param), std::string::npos) << c.body << " -> " << error.message;
  }
}

TEST(CompletionRequest, ChatMessagesAreChecked) {
  const std::vector<BadBody> cases = {
      {R"({"prompt": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]})", "messages[1].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0})", "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]})", "tools"},
  };
  for (const BadBody& c : cases) {
    const ApiError error = refused(c.body, /*chat=*/true);
    EXPECT_EQ(error.param, c.param) << c.body << " -> " << error.message;
  }
}

TEST(CompletionRequest, MalformedJsonIsA400) {
  for (const char* body : {"{", "", "[1, 2]", "{\"prompt\": \"a\",}", "null"}) {
    const ApiError error = refused(body);
    EXPECT_EQ(error.status, 400) << body;
    EXPECT_NE(error.message.find("JSON"), std::string::npos) << body << " -> " << error.message;
  }
}

TEST(CompletionRequest, AGoodBodyFillsTheGenerationRequest) {
  CompletionRequest request;
  ASSERT_FALSE(parse_completion_request(
      R"({"model": "m", "prompt": [5, 6, 7], "max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
          "seed": 3, "stop": ["\n\n", "END"], "stream": true, "stream_options": {"include_usage": true},
          "n": 1, "echo": false, "logprobs": null, "user": "ignored"})",
      false, request));
  EXPECT_EQ(request.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(*request.max_tokens, 9);
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
  EXPECT_EQ(request.generation.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(request.generation.sampling.seed, 3u);

  const ServedModel served{.name = "m", .max_model_len = 100, .vocab_size = 50, .defaults = {}};
  ASSERT_FALSE(finish_completion_request(request, request.prompt_ids, served, "prompt"));
  EXPECT_EQ(request.generation.prompt.size(), 3u);
  EXPECT_EQ(request.generation.max_tokens, 9);
  EXPECT_FLOAT_EQ(request.generation.sampling.temperature, 0.5f);
  EXPECT_EQ(request.generation.sampling.top_k, 40);

  CompletionRequest chat;
  ASSERT_FALSE(parse_completion_request(
      R"({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "max_tokens": 3, "max_completion_tokens": 4})",
      true, chat));
  ASSERT_EQ(chat.messages.size(), 2u);
  EXPECT_EQ(chat.messages[1].content, "ab");
  EXPECT_EQ(*chat.max_tokens, 4) << "max_completion_tokens wins over the deprecated max_tokens";
}

TEST(CompletionRequest, ThePromptIsCheckedAgainstTheVocabularyAndTheContext) {
  const ServedModel served{.name = "m", .max_model_len = 10, .vocab_size = 50, .defaults = {.eos_token_ids = {}, .temperature = 0.7f, .top_k = 0, .top_p = 1.0f}};
  CompletionRequest request;
  ASSERT_FALSE(parse_completion_request(R"({"prompt": [1]})", false, request));
  auto error = finish_completion_request(request, {1, 2, 50}, served, "prompt");
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "prompt");
  EXPECT_NE(error->message.find("50"), std::string::npos) << error->message;

  error = finish_completion_request(request, std::vector<int32_t>(10, 1), served, "prompt");
  ASSERT_TRUE(error) << "a prompt must leave room for one token";
  EXPECT_NE(error->message.find("context"), std::string::npos) << error->message;

  ASSERT_FALSE(parse_completion_request(R"({"prompt": "x", "max_tokens": 8})", false, request));
  error = finish_completion_request(request, {1, 2, 3}, served, "prompt");
  ASSERT_TRUE(error) << "3 + 8 > 10";
  EXPECT_EQ(error->param, "max_tokens");

  // Defaults: 16 for completions, cut to the context; the model's temperature when none is given.
  ASSERT_FALSE(parse_completion_request(R"({"prompt": "x"})", false, request));
  ASSERT_FALSE(finish_completion_request(request, {1, 2, 3}, served, "prompt"));
  EXPECT_EQ(request.generation.max_tokens, 7);
  EXPECT_FLOAT_EQ(request.generation.sampling.temperature, 0.7f);
}

TEST(CompletionRequest, AnotherModelNameIsA404) {
  const ServedModel served{.name = "slimkv-llama-15m", .max_model_len = 10, .vocab_size = 50, .defaults = {}};
  EXPECT_FALSE(check_model_name("", served));
  EXPECT_FALSE(check_model_name("slimkv-llama-15m", served));
  const auto error = check_model_name("gpt-4", served);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->status, 404);
  EXPECT_EQ(error->param, "model");
}

}  // namespace
}  // namespace slimkv
