// The PTX wrappers and code unpacking the attention kernels share (sm_80+): warp reductions,
// asynchronous copies to shared memory, the tensor-core mma shapes, and a packed field's codes spread
// one per byte.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace slimkv::cuda {

constexpr unsigned kFullMask = 0xffffffffu;  // every lane of a warp

// A value of every lane of the warp, reduced over the warp (each lane gets the result).
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}
__device__ __forceinline__ float warp_min(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fminf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// Copies the first `bytes` (0..16) of 16 bytes global → shared without passing through registers and
// fills the rest with zeros (src-size): tokens past a sequence's end are never read, and their zero V
// times a zero weight stays zero (whatever sits in the pool could be NaN).
__device__ __forceinline__ void cp_async_16_partial(void* shared, const void* global, int bytes) {
  const unsigned address = unsigned(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global), "r"(bytes));
}
// All 16 bytes, or zeros instead when !valid.
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool valid = true) {
  cp_async_16_partial(shared, global, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// mbarriers in shared memory (sm_80+): a phase completes when `count` arrivals have been made; a
// waiter names the phase by its parity. cp_async_arrive makes the arrival when all of this thread's
// earlier cp.async copies have landed (noinc: it is one of the `count`).
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(unsigned(__cvta_generic_to_shared(barrier))), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(unsigned(__cvta_generic_to_shared(barrier))) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint64_t* barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(unsigned(__cvta_generic_to_shared(barrier))) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, unsigned parity) {
  const unsigned address = unsigned(__cvta_generic_to_shared(barrier));
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred complete;\n mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        " selp.u32 %0, 1, 0, complete;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  }
}

// Four 8×8 FP16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
// Lane t receives row t / 4, columns 2(t % 4) and +1 of each (transposed with .trans).
__device__ inline void ldmatrix_x4(unsigned (&r)[4], const void* shared) {
  const unsigned address = unsigned(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* shared) {
  const unsigned address = unsigned(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ inline unsigned pack_halves(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const unsigned*>(&pair);
}

// Shared tiles are rows of kRowHalves halves in 16-byte chunks; chunk c of row r sits at c ^ (r % 8),
// so the 8 rows one ldmatrix phase reads fall in 8 different bank groups (no conflicts).
template <int kRowHalves>
__device__ inline int swizzled(int row, int chunk) {
  return row * kRowHalves + ((chunk ^ (row % 8)) * 8);
}

// d += a · b for a 16×16 FP16 A (row-major fragment), a 16×8 FP16 B (column-major fragment), FP32 d.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same for an A whose rows 8..15 are zero (decode tiles of at most 8 rows): a0 / a1 = a[0] / a[2]
// above, d = (c0, c1) of rows 0..7 only. The mma's rows 8..15 are written to registers left dead, so
// they take none of the accumulators.
__device__ __forceinline__ void mma_16816_rows_0_to_7(float (&d)[2], uint32_t a0, uint32_t a1, uint32_t b0, uint32_t b1) {
  asm volatile(
      "{\n .reg .f32 unused<2>;\n"
      " mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, unused0, unused1}, {%2, %6, %3, %6}, {%4, %5}, "
      "{%0, %1, %7, %7};\n}\n"
      : "+f"(d[0]), "+f"(d[1])
      : "r"(a0), "r"(a1), "r"(b0), "r"(b1), "r"(0u), "f"(0.0f));
}

// d += a · b for a 16×32 u8 A (row-major fragment), a 32×8 u8 B (column-major fragment), s32 d. Lane
// (g = lane / 4, i = lane % 4): a0 = row g, k 4i..4i+3; a1 = row g + 8; a2, a3 the same at k + 16;
// b0 = column g, k 4i..4i+3, b1 at k + 16; d0, d1 = row g, columns 2i, 2i + 1; d2, d3 = row g + 8.
__device__ __forceinline__ void mma_16832_u8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d = a · b + c, the u8 mma above with one s32 c for all four accumulators (held in registers once,
// not copied into d before every mma).
__device__ __forceinline__ void mma_16832_u8_plus(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int c) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// 4 codes of kBits each (the low 4·kBits bits of `field`, tensor/quantized_block.h's packing)
// spread to one byte each.
template <int kBits>
__device__ __forceinline__ uint32_t spread_codes(uint32_t field) {
  if constexpr (kBits == 2) {
    const uint32_t x = field & 0xffu;
    return (x | (x << 6) | (x << 12) | (x << 18)) & 0x03030303u;
  } else if constexpr (kBits == 4) {
    // bytes (c0 | c1 << 4, c2 | c3 << 4) and, shifted by 4, (c1 | .., c3): pick c0, c1, c2, c3.
    return __byte_perm(field, field >> 4, 0x5140) & 0x0f0f0f0fu;
  } else {
    return field;
  }
}

// The packed field of 4 codes of kBits each at p (kBits / 2 bytes, aligned to its size).
template <int kBits>
__device__ __forceinline__ uint32_t load_field(const uint8_t* p) {
  if constexpr (kBits == 2) {
    return *p;
  } else if constexpr (kBits == 4) {
    return *reinterpret_cast<const uint16_t*>(p);
  } else {
    return *reinterpret_cast<const uint32_t*>(p);
  }
}

}  // namespace slimkv::cuda
