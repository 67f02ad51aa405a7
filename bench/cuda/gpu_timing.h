// Timing GPU work in the CUDA benchmarks: CUDA events around groups of launches (one launch is too
// short to time alone), the median group, after warm-up launches.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"

namespace slimkv::cuda {

// The median over `repetitions` groups of `launches_per_group` calls of `step` of one call's time, ms.
inline Expected<double> median_launch_ms(const std::function<Status()>& step, int repetitions, int launches_per_group,
                                         int warm_up = 2) {
  for (int warm = 0; warm < warm_up; ++warm) SLIMKV_RETURN_IF_ERROR(step());
  SLIMKV_RETURN_IF_ERROR(device_synchronize("warm-up"));
  cudaEvent_t start, stop;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::vector<double> ms;
  Status status = Status::ok();
  for (int rep = 0; rep < repetitions && status.is_ok(); ++rep) {
    cudaEventRecord(start);
    for (int i = 0; i < launches_per_group && status.is_ok(); ++i) status = step();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float group_ms = 0;
    cudaEventElapsedTime(&group_ms, start, stop);
    ms.push_back(double(group_ms) / launches_per_group);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  SLIMKV_RETURN_IF_ERROR(status);
  SLIMKV_RETURN_IF_ERROR(device_synchronize("timed runs"));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace slimkv::cuda
