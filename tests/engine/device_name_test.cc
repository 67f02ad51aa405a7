// `--device` and EngineConfig::device (slimkv/device_name.h): cpu, cuda and cuda:N parse; every other
// form is refused with a message naming the text and the expected forms, by the parser and by
// Engine::load before anything loads (a GPU index beyond the visible ones: tests/cuda/device_choice_test.cc).
#include <gtest/gtest.h>

#include <string>

#include "slimkv/device_name.h"
#include "slimkv/engine.h"

namespace slimkv {
namespace {

TEST(DeviceName, ParsesCpuCudaAndCudaN) {
  struct Case {
    std::string text;
    bool cuda;
    int gpu;
  };
  for (const Case& c : {Case{"cpu", false, 0}, Case{"cuda", true, 0}, Case{"cuda:0", true, 0}, Case{"cuda:1", true, 1},
                        Case{"cuda:15", true, 15}, Case{"cuda:007", true, 7}}) {
    SCOPED_TRACE(c.text);
    const Expected<DeviceName> parsed = parse_device_name(c.text);
    ASSERT_TRUE(parsed) << parsed.status().message();
    EXPECT_EQ(parsed->cuda, c.cuda);
    EXPECT_EQ(parsed->gpu, c.gpu);
  }
}

TEST(DeviceName, RefusesOtherFormsNamingTheExpectedOnes) {
  for (const std::string text : {"cuda:x", "cuda:-1", "cuda:", "cpu:1", "cuda:1x", "cuda:+1", "cuda: 1", "cuda:99999999999",
                                 "CUDA", "gpu", "gpu:0", "", " cuda", "cuda:0:1", "tpu"}) {
    SCOPED_TRACE("'" + text + "'");
    const Expected<DeviceName> parsed = parse_device_name(text);
    ASSERT_FALSE(parsed);
    EXPECT_EQ(parsed.status().message(), "device '" + text + "' is not known: expected cpu, cuda, or cuda:N for visible GPU N "
                                          "(0 is the first, as CUDA_VISIBLE_DEVICES orders them)");
  }
}

// The engine refuses the same forms first: a model directory that does not exist is never looked at.
TEST(DeviceName, EngineLoadRefusesABadDeviceBeforeLoading) {
  for (const std::string device : {"cuda:x", "cpu:1"}) {
    const auto engine = Engine::load({.model_dir = "/nonexistent/model", .device = device});
    ASSERT_FALSE(engine);
    EXPECT_NE(engine.status().message().find("device '" + device + "' is not known"), std::string::npos)
        << engine.status().message();
  }
}

}  // namespace
}  // namespace slimkv
