#include "backend/cuda/row_gather.h"

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void gather_rows_kernel(RowGather g) {
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= g.rows) return;
  const uint2* in = reinterpret_cast<const uint2*>(g.source + g.offsets[row]);
  uint2* out = reinterpret_cast<uint2*>(g.out + (long long)row * g.row_bytes);
  for (int c = threadIdx.x; c < g.row_bytes / 8; c += 32) out[c] = in[c];
}

}  // namespace

Status gather_rows(const RowGather& g) {
  if (g.row_bytes % 8 != 0) return error("gather_rows: row_bytes ", g.row_bytes, " is not a multiple of 8");
  if (g.rows == 0) return Status::ok();
  gather_rows_kernel<<<unsigned((g.rows + kWarpsPerBlock - 1) / kWarpsPerBlock), dim3(32, kWarpsPerBlock)>>>(g);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
