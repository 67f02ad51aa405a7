// Throughput of vdpbf16ps zmm vs vfmadd231ps zmm: 16 independent accumulators, register operands.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
__attribute__((target("avx512f,avx512bf16"), noinline)) float dp(long iters) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x00010001);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    asm volatile("" : "+v"(a));
  }
  __m512 s = acc[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_ps(s, acc[j]);
  return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx512f"), noinline)) float fma(long iters) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-30f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(a, b, acc[j]);
    asm volatile("" : "+v"(a));
  }
  __m512 s = acc[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_ps(s, acc[j]);
  return _mm512_reduce_add_ps(s);
}
int main() {
  const long iters = 20000000;
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 2; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      float v = k ? fma(iters) : dp(iters);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%s: %.2f G instr/s (%g)\n", k ? "vfmadd231ps zmm" : "vdpbf16ps zmm", 16.0 * iters / s / 1e9, v);
    }
  }
}
