#include "backend/cuda/expert_gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gated_value.cuh"
#include "backend/cuda/weighted_choices.cuh"
#include "backend/cuda/weight_rows.cuh"

namespace slimkv::cuda {
namespace {

constexpr int kWarps = 8;  // a weight row each
constexpr int kThreads = kWarps * 32;

// blockIdx.y: the expert slot; blockIdx.x: kWarps weight rows of that expert's matrix. An expert's places
// run through multiply_warp_rows kWarpRowsMaxInputs at a time, each time reading its rows again (from
// L2 where they stay: decode batches give an expert a few rows). With sum.out, the last CTA of each
// blockIdx.x to finish (each CTA's products made visible device-wide before it counts itself done, as
// CUDA's threadFenceReduction sample) sums those kWarps columns of every row and sets the count back to 0.
template <BlockQuant Q, typename In>
__global__ void __launch_bounds__(kThreads)
    grouped_gemv_kernel(const In* x, const int32_t* x_rows, const uint8_t* body, const uint16_t* scales,
                        size_t stride_bytes, int64_t rows, int64_t cols, const int32_t* first_place,
                        const int32_t* active_experts, float* y, int64_t y_stride, WeightedRowSum sum,
                        const int32_t* place_of_choice) {
  const int expert = active_experts[blockIdx.y];
  const int64_t first_row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (expert >= 0 && first_row < rows) {  // the whole warp
    const uint8_t* expert_body = body + size_t(expert) * stride_bytes;
    const uint16_t* expert_scales = scales != nullptr ? scales + size_t(expert) * stride_bytes / 2 : nullptr;
    const int first = first_place[expert], end = first_place[expert + 1];
    for (int place = first; place < end; place += kWarpRowsMaxInputs) {
      const int n = min(kWarpRowsMaxInputs, end - place);
      multiply_warp_rows<Q, In, 1>(x, x_rows, place, n, expert_body, expert_scales, rows, cols, first_row, y,
                                   y_stride, /*accumulate=*/false);
    }
  }
  if (sum.out == nullptr) return;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(sum.finished_ctas + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) sum.finished_ctas[blockIdx.x] = 0;
  const int64_t first_column = int64_t(blockIdx.x) * kWarps;
  for (int i = int(threadIdx.x); i < sum.n * kWarps; i += int(blockDim.x)) {
    const int t = i / kWarps;
    const int64_t column = first_column + i % kWarps;
    if (column >= rows) continue;
    float* out = sum.out + t * rows + column;
    const float value = weighted_choices_sum(y, place_of_choice, sum.weight, size_t(t), sum.k, size_t(column),
                                             size_t(y_stride));
    *out = sum.accumulate ? *out + value : value;
  }
}

// As grouped_gemv_kernel, a warp per intermediate column o: rows o and intermediate + o of W_gate|W_up,
// act(g) · u written in In.
template <BlockQuant Q, typename In>
__global__ void __launch_bounds__(kThreads)
    grouped_gated_gemv_kernel(const In* x, const int32_t* x_rows, const uint8_t* body, const uint16_t* scales,
                              size_t stride_bytes, int64_t intermediate, int64_t cols, const int32_t* first_place,
                              const int32_t* active_experts, GateActivation activation, In* out) {
  const int expert = active_experts[blockIdx.y];
  if (expert < 0) return;
  const int64_t column = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (column >= intermediate) return;  // the whole warp
  const uint8_t* expert_body = body + size_t(expert) * stride_bytes;
  const uint16_t* expert_scales = scales != nullptr ? scales + size_t(expert) * stride_bytes / 2 : nullptr;
  const int first = first_place[expert], end = first_place[expert + 1];
  for (int place = first; place < end; place += kWarpRowsMaxInputs) {
    const int n = min(kWarpRowsMaxInputs, end - place);
    float sums[2][kWarpRowsMaxInputs];  // gate, up
    warp_row_sums<Q, In, 2>(x, x_rows, place, n, expert_body, expert_scales, 2 * intermediate, cols, column,
                            intermediate, sums);
    if (threadIdx.x % 32 == 0) {
#pragma unroll
      for (int i = 0; i < kWarpRowsMaxInputs; ++i) {
        if (i >= n) break;
        out[(place + i) * intermediate + column] = from_float<In>(gated_value(sums[0][i], sums[1][i], activation));
      }
    }
  }
}

// Calls f with std::integral_constant<BlockQuant, quant> (kNone: plain rows).
template <typename F>
Status with_kind(BlockQuant quant, F&& f) {
  switch (quant) {
    case BlockQuant::kQ8_0: return f(std::integral_constant<BlockQuant, BlockQuant::kQ8_0>());
    case BlockQuant::kQ4_0: return f(std::integral_constant<BlockQuant, BlockQuant::kQ4_0>());
    case BlockQuant::kQ4_K: return f(std::integral_constant<BlockQuant, BlockQuant::kQ4_K>());
    case BlockQuant::kQ6_K: return f(std::integral_constant<BlockQuant, BlockQuant::kQ6_K>());
    case BlockQuant::kNone: return f(std::integral_constant<BlockQuant, BlockQuant::kNone>());
  }
  return error("grouped expert GEMV: unknown block type");
}

}  // namespace

DeviceMatrix ExpertMatrices::expert(int e) const {
  DeviceMatrix m = first;
  m.data = static_cast<uint8_t*>(first.data) + size_t(e) * stride_bytes;
  if (first.scales != nullptr) m.scales = first.scales + size_t(e) * stride_bytes / 2;
  return m;
}

Status check_grouped_expert_shape(const ExpertMatrices& w) {
  if (w.stride_bytes % 16 != 0) {
    return error("grouped expert GEMV: experts ", w.stride_bytes, " bytes apart (expected a multiple of 16: 16-byte loads)");
  }
  if (w.first.quantized()) return check_quantized_shape("grouped expert GEMV", w.first.quant, w.first.rows, w.first.cols);
  if (w.first.dtype != DType::kF16 && w.first.dtype != DType::kBF16) {
    return error("grouped expert GEMV: plain weights in ", dtype_name(w.first.dtype), " (expected F16 or BF16)");
  }
  if (w.first.rows < 1 || w.first.cols < 8 || w.first.cols % 8 != 0) {
    return error("grouped expert GEMV: plain [", w.first.rows, ", ", w.first.cols, "] matrices (expected rows of a ",
                 "positive multiple of 8 values)");
  }
  return Status::ok();
}

namespace {

Status check_inputs(DType x_dtype, const ExpertMatrices& w) {
  if (x_dtype != DType::kF16 && x_dtype != DType::kBF16) {
    return error("grouped expert GEMV: inputs in ", dtype_name(x_dtype), " (expected F16 or BF16)");
  }
  if (!w.first.quantized() && w.first.dtype != x_dtype) {
    return error("grouped expert GEMV: inputs in ", dtype_name(x_dtype), " with weights in ", dtype_name(w.first.dtype),
                 " (expected the same)");
  }
  return check_grouped_expert_shape(w);
}

}  // namespace

int64_t grouped_sum_counters(int64_t rows) { return (rows + kWarps - 1) / kWarps; }

Status grouped_expert_gemv(const void* x, const int32_t* x_rows, DType x_dtype, const ExpertMatrices& w,
                           const ExpertRowsPlan& plan, int slots, float* y, int64_t y_stride,
                           const WeightedRowSum& sum) {
  SLIMKV_RETURN_IF_ERROR(check_inputs(x_dtype, w));
  if (y_stride < w.first.rows) {
    return error("grouped expert GEMV: output row stride ", y_stride, " under its ", w.first.rows, " columns");
  }
  if (slots == 0) return Status::ok();
  const dim3 grid(unsigned((w.first.rows * 32 + kThreads - 1) / kThreads), unsigned(slots));
  const auto* body = static_cast<const uint8_t*>(w.first.data);
  return with_kind(w.first.quant, [&](auto q) {
    constexpr BlockQuant Q = decltype(q)::value;
    if (x_dtype == DType::kBF16) {
      grouped_gemv_kernel<Q><<<grid, kThreads>>>(static_cast<const __nv_bfloat16*>(x), x_rows, body, w.first.scales,
                                                 w.stride_bytes, w.first.rows, w.first.cols, plan.first_place,
                                                 plan.active_experts, y, y_stride, sum, plan.place_of_choice);
    } else {
      grouped_gemv_kernel<Q><<<grid, kThreads>>>(static_cast<const __half*>(x), x_rows, body, w.first.scales,
                                                 w.stride_bytes, w.first.rows, w.first.cols, plan.first_place,
                                                 plan.active_experts, y, y_stride, sum, plan.place_of_choice);
    }
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    return Status::ok();
  });
}

Status grouped_expert_gated_gemv(const void* x, const int32_t* x_rows, DType x_dtype, const ExpertMatrices& w_gate_up,
                                 GateActivation activation, const ExpertRowsPlan& plan, int slots, void* out) {
  SLIMKV_RETURN_IF_ERROR(check_inputs(x_dtype, w_gate_up));
  if (w_gate_up.first.rows % 2 != 0) {
    return error("grouped gated expert GEMV: W_gate|W_up of ", w_gate_up.first.rows, " rows (expected gate and up alike)");
  }
  if (slots == 0) return Status::ok();
  const int64_t intermediate = w_gate_up.first.rows / 2;
  const dim3 grid(unsigned((intermediate * 32 + kThreads - 1) / kThreads), unsigned(slots));
  const auto* body = static_cast<const uint8_t*>(w_gate_up.first.data);
  return with_kind(w_gate_up.first.quant, [&](auto q) {
    constexpr BlockQuant Q = decltype(q)::value;
    const auto launch = [&](auto* typed_out) {
      using In = std::remove_pointer_t<decltype(typed_out)>;
      grouped_gated_gemv_kernel<Q><<<grid, kThreads>>>(static_cast<const In*>(x), x_rows, body, w_gate_up.first.scales,
                                                       w_gate_up.stride_bytes, intermediate, w_gate_up.first.cols,
                                                       plan.first_place, plan.active_experts, activation, typed_out);
    };
    x_dtype == DType::kBF16 ? launch(static_cast<__nv_bfloat16*>(out)) : launch(static_cast<__half*>(out));
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    return Status::ok();
  });
}

}  // namespace slimkv::cuda
