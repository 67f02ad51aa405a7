// The CUDA backend as a plugin: libslimkv_cuda.so (src/*/cuda/, cmake/cuda.cmake), opened with dlopen
// the first time an engine asks for device "cuda", as ggml opens its dynamic backends. A CPU run never
// maps the CUDA runtime or cuBLAS (~225 MB of resident memory when the CLI linked them), and a program
// built where nvcc exists still runs where no GPU, driver or CUDA library is.
//
// The plugin is built from the same sources in the same build as the engine and shares its C++ types
// (LlamaModel, KvPipeline, EngineConfig, DeviceModel) by layout, so the engine accepts only the plugin
// of its own build: both carry the build's tag (configured once per build folder), and a plugin with
// another tag is refused by name rather than run with mismatched types. The plugin keeps its own copy of
// the engine library's code it calls, with every symbol but the entry hidden (no interposition).
#pragma once

#include <memory>
#include <string_view>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/ipc_memory.h"
#include "backend/cuda/nccl_link.h"
#include "engine/device_model.h"

namespace slimkv {

// What the plugin's entry returns.
struct CudaPlugin {
  const char* build_tag;  // SLIMKV_CUDA_PLUGIN_TAG of the build that made the plugin
  Expected<std::unique_ptr<DeviceModel>> (*load_model)(const LlamaModel& model, const KvPipeline& pipeline,
                                                       const EngineConfig& config, int gpu);
  // `--device cuda:N`: whether visible GPU N exists (backend/cuda/device_memory.h), asked before loading.
  decltype(&cuda::check_visible_gpu) check_visible_gpu;
  // CUDA IPC between processes of one GPU (backend/cuda/ipc_memory.h): the KV stream's device path.
  decltype(&cuda::device_uuid) device_uuid;
  decltype(&cuda::ipc_handle_of) ipc_handle_of;
  decltype(&cuda::copy_from_ipc_handle) copy_from_ipc_handle;
  decltype(&cuda::shared_device_allocation_on) shared_device_allocation_on;
  // NCCL links between processes on two GPUs (backend/cuda/nccl_link.h): the KV stream's other device path.
  decltype(&cuda::nccl_available) nccl_available;
  decltype(&cuda::nccl_new_id) nccl_new_id;
  decltype(&cuda::nccl_connect) nccl_connect;
  decltype(&cuda::nccl_send) nccl_send;
  decltype(&cuda::nccl_receive) nccl_receive;
  decltype(&cuda::nccl_wait) nccl_wait;
  decltype(&cuda::nccl_link_broken) nccl_link_broken;
};

inline constexpr const char* kCudaPluginFile = "libslimkv_cuda.so";
inline constexpr const char* kCudaPluginEntry = "slimkv_cuda_plugin";
// An explicit plugin file; otherwise it is looked for beside the program (or the library, such as the
// Python module) that holds the engine, then by the dynamic loader's own search (LD_LIBRARY_PATH, ...).
inline constexpr const char* kCudaPluginVariable = "SLIMKV_CUDA_LIBRARY";

// The build tag this engine accepts; nullptr when the build has no CUDA backend (nvcc was not found).
const char* cuda_plugin_build_tag();

// The plugin, opened once per process by the first caller. The error names every place tried and why
// each failed, or that the build has no CUDA backend (naming `device`, the device asked for).
Expected<const CudaPlugin*> cuda_plugin(std::string_view device = "cuda");

// Device "cuda:N": the plugin opened once per process and asked whether visible GPU N exists. The error
// names every place tried and why each failed (the dynamic loader's message, e.g. a missing libcublas),
// or how many GPUs this process sees.
Status check_cuda_gpu(int gpu);

// The model on visible GPU `gpu` (after check_cuda_gpu).
Expected<std::unique_ptr<DeviceModel>> open_cuda_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                       const EngineConfig& config, int gpu);

}  // namespace slimkv

// The plugin's one exported symbol (src/engine/cuda/cuda_plugin.cc, built with hidden visibility),
// looked up by kCudaPluginEntry.
extern "C" __attribute__((visibility("default"))) const slimkv::CudaPlugin* slimkv_cuda_plugin();
