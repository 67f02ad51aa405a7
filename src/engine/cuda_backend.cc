#include "engine/cuda_backend.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "slimkv/engine.h"

namespace slimkv {

namespace {

namespace fs = std::filesystem;

// Where the plugin may be: the file SLIMKV_CUDA_LIBRARY names (alone: an explicit choice is not second-
// guessed), else beside the module holding this code (the CLI, a test, the Python module's .so) and
// beside the running program, then the bare file name for the dynamic loader's search.
std::vector<std::string> plugin_candidates() {
  if (const char* file = std::getenv(kCudaPluginVariable); file != nullptr && *file != '\0') return {file};
  std::vector<std::string> candidates;
  auto add_beside = [&](const fs::path& module) {
    if (!module.has_parent_path()) return;
    const std::string path = (module.parent_path() / kCudaPluginFile).string();
    for (const std::string& known : candidates) {
      if (known == path) return;
    }
    candidates.push_back(path);
  };
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuda_plugin_build_tag), &info) != 0 && info.dli_fname != nullptr) {
    add_beside(fs::path(info.dli_fname));
  }
  std::error_code ignored;
  add_beside(fs::read_symlink("/proc/self/exe", ignored));
  candidates.push_back(kCudaPluginFile);
  return candidates;
}

// The plugin of this build, opened by the first caller; later callers get the same one. A failure is
// not kept: a later call (after SLIMKV_CUDA_LIBRARY is set, say) tries again.
Expected<const CudaPlugin*> load_plugin(const char* tag) {
  static std::mutex mutex;
  static const CudaPlugin* plugin = nullptr;
  const std::lock_guard<std::mutex> lock(mutex);
  if (plugin != nullptr) return plugin;
  std::string tried;
  for (const std::string& path : plugin_candidates()) {
    const bool by_search = path.find('/') == std::string::npos;
    std::error_code ignored;
    if (!by_search && !fs::exists(path, ignored)) {
      tried += str_cat("; ", path, ": no such file");
      continue;
    }
    // RTLD_NOW: a missing CUDA library (libcublas) is reported here, naming itself, not at a first call.
    // RTLD_LOCAL: the plugin's symbols stay its own. The handle is never closed (its code and the
    // objects it made live as long as the process).
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += str_cat("; ", by_search ? str_cat(path, " (the dynamic loader's search)") : path, ": ",
                       why != nullptr ? why : "dlopen failed");
      continue;
    }
    auto entry = reinterpret_cast<decltype(&slimkv_cuda_plugin)>(dlsym(handle, kCudaPluginEntry));
    if (entry == nullptr) {
      dlclose(handle);
      tried += str_cat("; ", path, ": does not export ", kCudaPluginEntry, " (not slimkv's CUDA backend)");
      continue;
    }
    const CudaPlugin* found = entry();
    if (std::strcmp(found->build_tag, tag) != 0) {
      // Not closed either: its static objects are constructed, and nothing of it is used.
      return error("device 'cuda': ", path, " is the CUDA backend of another slimkv build (its build tag ",
                   found->build_tag, ", this program's ", tag, "); the engine and the backend share C++ types, so only ",
                   "the plugin built with this program can be used: rebuild, or point ", kCudaPluginVariable,
                   " at this build's ", kCudaPluginFile);
    }
    plugin = found;
    return plugin;
  }
  return error("device 'cuda': the CUDA backend (", kCudaPluginFile, ", built beside slimkv where the CUDA ",
               "toolkit is found) could not be loaded; it needs the CUDA runtime libraries (libcublas) and a GPU ",
               "driver; set ", kCudaPluginVariable, " to its path if it was moved. Tried", tried.substr(1));
}

}  // namespace

const char* cuda_plugin_build_tag() {
#ifdef SLIMKV_CUDA_PLUGIN_TAG
  return SLIMKV_CUDA_PLUGIN_TAG;
#else
  return nullptr;
#endif
}

Expected<const CudaPlugin*> cuda_plugin(std::string_view device) {
  const char* tag = cuda_plugin_build_tag();
  if (tag == nullptr) {
    return error("device '", device, "': this build has no CUDA backend (nvcc was not found when it was configured; ",
                 "install the CUDA toolkit and rebuild, or configure with -DSLIMKV_CUDA=ON to insist)");
  }
  return load_plugin(tag);
}

Status check_cuda_gpu(int gpu) {
  SLIMKV_ASSIGN_OR_RETURN(const CudaPlugin* plugin, cuda_plugin(str_cat("cuda:", gpu)));
  return plugin->check_visible_gpu(gpu);
}

Expected<std::unique_ptr<DeviceModel>> open_cuda_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                       const EngineConfig& config, int gpu) {
  SLIMKV_ASSIGN_OR_RETURN(const CudaPlugin* plugin, cuda_plugin());
  return plugin->load_model(model, pipeline, config, gpu);
}

}  // namespace slimkv
