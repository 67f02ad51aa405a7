// The one exported symbol of libslimkv_cuda.so (engine/cuda_backend.h): the build's tag, for the engine
// to refuse a plugin of another build, and the backend's device model.
#include "engine/cuda_backend.h"

#ifndef SLIMKV_CUDA_PLUGIN_TAG
#error "cmake/cuda.cmake defines SLIMKV_CUDA_PLUGIN_TAG for the plugin and the engine's loader"
#endif

extern "C" __attribute__((visibility("default"))) const slimkv::CudaPlugin* slimkv_cuda_plugin() {
  static const slimkv::CudaPlugin plugin{SLIMKV_CUDA_PLUGIN_TAG, &slimkv::load_cuda_model,
                                         &slimkv::cuda::check_visible_gpu,
                                         &slimkv::cuda::device_uuid, &slimkv::cuda::ipc_handle_of,
                                         &slimkv::cuda::copy_from_ipc_handle,
                                         &slimkv::cuda::shared_device_allocation_on,
                                         &slimkv::cuda::nccl_available,
                                         &slimkv::cuda::nccl_new_id,
                                         &slimkv::cuda::nccl_connect,
                                         &slimkv::cuda::nccl_send,
                                         &slimkv::cuda::nccl_receive,
                                         &slimkv::cuda::nccl_wait,
                                         &slimkv::cuda::nccl_link_broken};
  return &plugin;
}
