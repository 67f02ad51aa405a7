// The CUDA backend as a plugin (engine/cuda_backend.h): a CPU engine maps no CUDA library, and
// `--device cuda` without a usable plugin is an error naming each place tried and why it failed. The
// plugin itself is opened by the CUDA suite's engine tests (tests/cuda/engine_cuda_test.cc) on the GPU.
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <vector>
#include <string>

#include "engine/cuda_backend.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kModel = slimkv::test::source_dir() + "/tests/data/models/llama_gqa_bf16";

// The plugin's location for one test, restored after it.
class PluginVariable {
 public:
  explicit PluginVariable(const std::string& value) { setenv(kCudaPluginVariable, value.c_str(), 1); }
  ~PluginVariable() { unsetenv(kCudaPluginVariable); }
};

std::string cuda_load_error() {
  auto engine = Engine::load({.model_dir = kModel, .kv_spec = "dense", .device = "cuda", .threads = 1});
  EXPECT_FALSE(engine) << "the CUDA backend loaded from a path that does not hold it";
  return engine ? "" : engine.status().message();
}

TEST(CudaBackend, CpuEngineMapsNoCudaLibrary) {
  auto engine = Engine::load({.model_dir = kModel, .kv_spec = "dense", .threads = 1});
  ASSERT_TRUE(engine) << engine.status().message();
  auto session = (*engine)->new_session();
  const std::vector<int32_t> prompt = {1, 2, 3};
  ASSERT_TRUE(session->prefill(prompt));
  std::ifstream maps("/proc/self/maps");
  ASSERT_TRUE(maps);
  for (std::string line; std::getline(maps, line);) {
    for (const char* library : {"libcublas", "libcudart", "libcuda.so", kCudaPluginFile}) {
      EXPECT_EQ(line.find(library), std::string::npos) << "a CPU engine mapped " << library << ": " << line;
    }
  }
}

TEST(CudaBackend, AMissingPluginIsNamedWithTheVariableToSet) {
  const PluginVariable variable("/nonexistent/libslimkv_cuda.so");
  const std::string message = cuda_load_error();
  if (cuda_plugin_build_tag() == nullptr) {
    EXPECT_NE(message.find("this build has no CUDA backend"), std::string::npos) << message;
    return;
  }
  EXPECT_NE(message.find("/nonexistent/libslimkv_cuda.so: no such file"), std::string::npos) << message;
  EXPECT_NE(message.find(kCudaPluginVariable), std::string::npos) << message;
  EXPECT_NE(message.find("libcublas"), std::string::npos) << message;  // what the plugin needs
}

TEST(CudaBackend, ALibraryThatIsNotThePluginIsRefusedByName) {
  if (cuda_plugin_build_tag() == nullptr) GTEST_SKIP() << "this build has no CUDA backend: no plugin is looked for";
  // A shared library every process has, which is not slimkv's backend (a function ASan does not intercept).
  Dl_info libc{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&gnu_get_libc_version), &libc), 0);
  const PluginVariable variable(libc.dli_fname);
  const std::string message = cuda_load_error();
  EXPECT_NE(message.find(std::string(libc.dli_fname) + ": does not export slimkv_cuda_plugin"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace slimkv
