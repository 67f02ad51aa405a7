#include "attention/cpu/hack_block_attention.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "attention/cpu/spread_prefetch.h"
#include "attention/hack_operands.h"
#include "attention/hack_reference.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/cpu/hack_block_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#if HWY_TARGET == HWY_AVX3_DL
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DI = hn::ScalableTag<int32_t>;
using DU = hn::Rebind<uint32_t, DI>;
using DF = hn::Rebind<float, DI>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;
using VF = hn::Vec<DF>;

// Query rows whose integer accumulators stay in registers together (a GQA group in decode).
constexpr int kQueryBatch = 4;
// Σ 4 bytes of 0x01: the integer product that sums codes (for the SE ablation); in memory, as DotBytes
// reads its operand.
constexpr int32_t kOnes[1] = {0x01010101};

// The codes of N lanes (each lane: 4 values packed at kBits in kBits/2 bytes) spread to one byte each,
// the lanes in the order LaneOrder<kBits> restores.
template <int kBits>
HWY_INLINE VU LoadCodeBytes(const uint8_t* packed) {
  const DU du;
#if HWY_TARGET == HWY_AVX3_DL
  // VBMI: the packed lanes broadcast to every 128-bit (2 bits) or 256-bit (4 bits) part of the vector,
  // which costs only a load, then one multishift picks each value's bits into its own byte from the
  // 64-bit word that holds them (an AND keeps b bits). Each word yields two lanes of its own 8 (2 bits)
  // or 4 (4 bits), so the lanes come out of order: lane 4m + 2h + e holds lane 8h + 2m + e of the 16
  // (2 bits), lane 8a + 2c + e lane 4c + 2a + e (4 bits). Zero-extending the lanes first to put each in
  // its word (vpmovzx) cost a shuffle-port micro-op per load (512-bit vector work runs on two ports
  // only); the integer sums put back in order cost one permute per query per run. Measured with the
  // operand broadcast below: 2-bit blocks of 2 queries in cache 610 -> 567 ns, 4-bit 698 -> 658 ns.
  if constexpr (kBits == 2) {
    const __m512i fields = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed)));
    const __m512i control = _mm512_set_epi64(0x3E3C3A3836343230ll, 0x3E3C3A3836343230ll, 0x2E2C2A2826242220ll,
                                             0x2E2C2A2826242220ll, 0x1E1C1A1816141210ll, 0x1E1C1A1816141210ll,
                                             0x0E0C0A0806040200ll, 0x0E0C0A0806040200ll);
    return hn::And(VU{_mm512_multishift_epi64_epi8(control, fields)}, hn::Set(du, 0x03030303u));
  } else if constexpr (kBits == 4) {
    const __m512i fields = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed)));
    const __m512i control = _mm512_set_epi64(0x3C3834302C282420ll, 0x3C3834302C282420ll, 0x3C3834302C282420ll,
                                             0x3C3834302C282420ll, 0x1C1814100C080400ll, 0x1C1814100C080400ll,
                                             0x1C1814100C080400ll, 0x1C1814100C080400ll);
    return hn::And(VU{_mm512_multishift_epi64_epi8(control, fields)}, hn::Set(du, 0x0F0F0F0Fu));
  }
#endif
  if constexpr (kBits == 2) {
    const VU f = hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint8_t, DU>(), packed));
    const VU spread = hn::Or(hn::Or(f, hn::ShiftLeft<6>(f)), hn::Or(hn::ShiftLeft<12>(f), hn::ShiftLeft<18>(f)));
    return hn::And(spread, hn::Set(du, 0x03030303u));
  } else if constexpr (kBits == 4) {
    const VU f = hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint16_t, DU>(), reinterpret_cast<const uint16_t*>(packed)));
    return hn::Or(hn::Or(hn::And(f, hn::Set(du, 0xFu)), hn::ShiftLeft<4>(hn::And(f, hn::Set(du, 0xF0u)))),
                  hn::Or(hn::ShiftLeft<8>(hn::And(f, hn::Set(du, 0xF00u))), hn::ShiftLeft<12>(hn::And(f, hn::Set(du, 0xF000u)))));
  } else {
    return hn::LoadU(du, reinterpret_cast<const uint32_t*>(packed));
  }
}

// Integer sums over LoadCodeBytes<kBits>' lanes put back in lane order.
template <int kBits>
HWY_INLINE VI LaneOrder(VI x) {
#if HWY_TARGET == HWY_AVX3_DL
  if constexpr (kBits == 2) {  // lane j from lane 4m + 2h + e, j = 8h + 2m + e
    return VI{_mm512_permutexvar_epi32(_mm512_set_epi32(15, 14, 11, 10, 7, 6, 3, 2, 13, 12, 9, 8, 5, 4, 1, 0), x.raw)};
  } else if constexpr (kBits == 4) {  // lane j from lane 8a + 2c + e, j = 4c + 2a + e
    return VI{_mm512_permutexvar_epi32(_mm512_set_epi32(15, 14, 7, 6, 13, 12, 5, 4, 11, 10, 3, 2, 9, 8, 1, 0), x.raw)};
  }
#endif
  return x;
}

// acc[lane] += Σ_{i<4} (unsigned byte i of codes[lane]) · (signed byte i of *operand)
HWY_INLINE VI DotBytes(VI acc, VU codes, const int32_t* operand) {
#if HWY_TARGET == HWY_AVX3_DL
  // vpdpbusd as inline assembly: Highway's AVX3_DL target string enables avxvnni but not
  // avx512vnni, so the intrinsic would not compile (and clang ignores an added target pragma).
  // Every CPU Highway dispatches AVX3_DL to (Ice Lake and later, Zen 4) has AVX-512 VNNI.
  // The operand broadcast from memory within the instruction ({1to16}): one fused micro-op.
  __m512i sum = acc.raw;
  asm("vpdpbusd %[weights]%{1to16%}, %[codes], %[sum]"
      : [sum] "+v"(sum)
      : [codes] "v"(codes.raw), [weights] "m"(*operand));
  return VI{sum};
#else
  const DI di;
  const DU du;
  for (int i = 0; i < 4; ++i) {
    const VI code = hn::BitCast(di, hn::And(hn::ShiftRightSame(codes, 8 * i), hn::Set(du, 0xFFu)));
    acc = hn::Add(acc, hn::Mul(code, hn::Set(di, int32_t(int8_t(uint32_t(*operand) >> (8 * i))))));
  }
  return acc;
#endif
}

HWY_INLINE VF LoadHalf(const uint16_t* p) {
  return hn::PromoteTo(DF(), hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), reinterpret_cast<const hwy::float16_t*>(p)));
}
HWY_INLINE VI LoadInt16(const int16_t* p) { return hn::PromoteTo(DI(), hn::LoadU(hn::Rebind<int16_t, DI>(), p)); }

// An 8-bit operand's min and scale (as quantize_operand8 takes them) from lane-wise minima and maxima.
HWY_INLINE Operand8 Operand8FromLanes(VF lo, VF hi) {
  const DF df;
  Operand8 op;
  op.min = hn::GetLane(hn::MinOfLanes(df, lo));
  op.scale = (hn::GetLane(hn::MaxOfLanes(df, hi)) - op.min) / 255.0f;
  return op;
}

// The range of x (n, a multiple of the vector length) as an 8-bit operand's min and scale.
HWY_INLINE Operand8 Operand8Range(const float* x, int n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF lo = hn::LoadU(df, x), hi = lo;
  for (size_t i = lanes; i < size_t(n); i += lanes) {
    lo = hn::Min(lo, hn::LoadU(df, x + i));
    hi = hn::Max(hi, hn::LoadU(df, x + i));
  }
  return Operand8FromLanes(lo, hi);
}

// x's 8-bit codes in op's range, packed 4 per int32 with the -128 offset (byte ^ 0x80); sets op.sum.
// The same rounding as quantize_operand8.
HWY_INLINE void QuantizeOperand8(const float* x, int n, Operand8& op, int32_t* packed) {
  const DF df;
  const DI di;
  const size_t lanes = hn::Lanes(df);
  const VF inverse = hn::Set(df, op.scale > 0.0f ? 1.0f / op.scale : 0.0f), min = hn::Set(df, op.min);
  auto* bytes = reinterpret_cast<uint8_t*>(packed);
  VI sum = hn::Zero(di);
  for (size_t i = 0; i < size_t(n); i += lanes) {
    VI code = hn::NearestInt(hn::Mul(hn::Sub(hn::LoadU(df, x + i), min), inverse));
    code = hn::Min(hn::Max(code, hn::Zero(di)), hn::Set(di, 255));
    sum = hn::Add(sum, code);
    hn::StoreU(hn::DemoteTo(hn::Rebind<uint8_t, DI>(), hn::Xor(code, hn::Set(di, 0x80))), hn::Rebind<uint8_t, DI>(),
               bytes + i);
  }
  op.sum = hn::GetLane(hn::SumOfLanes(di, sum));
}

// The largest of n FP16 values (n a multiple of the vector length; a block's scales).
HWY_INLINE float MaxOfHalves(const uint16_t* x, int n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF hi = LoadHalf(x);
  for (size_t i = lanes; i < size_t(n); i += lanes) hi = hn::Max(hi, LoadHalf(x + i));
  return hn::GetLane(hn::MaxOfLanes(df, hi));
}

// lrint of each lane (product_code's rounding). The operands' codes stay within ±256, so AVX-512's
// plain conversion needs none of NearestInt's overflow fix-up.
HWY_INLINE VI RoundToInt(VF x) {
#if HWY_TARGET == HWY_AVX3_DL
  return VI{_mm512_cvtps_epi32(x.raw)};
#else
  return hn::NearestInt(x);
#endif
}

// The low byte of each lane of codes, one per byte from `bytes` on.
HWY_INLINE void StoreCodeBytes(VI codes, uint8_t* bytes) {
#if HWY_TARGET == HWY_AVX3_DL
  // vpmovdb: this Highway's TruncateTo for AVX3_DL (a VBMI byte permute) left the lanes whole.
  _mm_storeu_si128(reinterpret_cast<__m128i*>(bytes), _mm512_cvtepi32_epi8(codes.raw));
#else
  const hn::Rebind<uint8_t, DU> d8;
  hn::StoreU(hn::TruncateTo(d8, hn::BitCast(DU(), codes)), d8, bytes);
#endif
}

// acc[r] = Σ_{i < count} codes_i · operands[r · operand_stride + i] for the batch's kBatch queries,
// where codes_i are the lanes packed at codes + i · code_stride; also code_sum = Σ codes_i when
// `with_code_sum` (the SE ablation). The batch size is a template parameter so that the accumulators
// stay in registers, two chains per query to hide the integer product's latency.
template <int kBits, int kBatch>
HWY_INLINE void DotRun(const uint8_t* codes, size_t code_stride, const int32_t* operands, size_t operand_stride,
                       int count, bool with_code_sum, VI* acc, VI& code_sum) {
  const DI di;
  VI even[kBatch], odd[kBatch];
  for (int r = 0; r < kBatch; ++r) even[r] = odd[r] = hn::Zero(di);
  VI sum_even = hn::Zero(di), sum_odd = hn::Zero(di);
  int i = 0;
  for (; i + 1 < count; i += 2) {
    const VU a = LoadCodeBytes<kBits>(codes + size_t(i) * code_stride);
    const VU b = LoadCodeBytes<kBits>(codes + size_t(i + 1) * code_stride);
    for (int r = 0; r < kBatch; ++r) {
      even[r] = DotBytes(even[r], a, operands + size_t(r) * operand_stride + i);
      odd[r] = DotBytes(odd[r], b, operands + size_t(r) * operand_stride + i + 1);
    }
    if (with_code_sum) {
      sum_even = DotBytes(sum_even, a, kOnes);
      sum_odd = DotBytes(sum_odd, b, kOnes);
    }
  }
  if (i < count) {
    const VU a = LoadCodeBytes<kBits>(codes + size_t(i) * code_stride);
    for (int r = 0; r < kBatch; ++r) even[r] = DotBytes(even[r], a, operands + size_t(r) * operand_stride + i);
    if (with_code_sum) sum_even = DotBytes(sum_even, a, kOnes);
  }
  for (int r = 0; r < kBatch; ++r) acc[r] = LaneOrder<kBits>(hn::Add(even[r], odd[r]));
  code_sum = with_code_sum ? LaneOrder<kBits>(hn::Add(sum_even, sum_odd)) : hn::Zero(di);
}

template <int kBits>
HWY_INLINE void DotRunBatch(int batch, const uint8_t* codes, size_t code_stride, const int32_t* operands,
                            size_t operand_stride, int count, bool with_code_sum, VI* acc, VI& code_sum) {
  switch (batch) {
    case 1: return DotRun<kBits, 1>(codes, code_stride, operands, operand_stride, count, with_code_sum, acc, code_sum);
    case 2: return DotRun<kBits, 2>(codes, code_stride, operands, operand_stride, count, with_code_sum, acc, code_sum);
    case 3: return DotRun<kBits, 3>(codes, code_stride, operands, operand_stride, count, with_code_sum, acc, code_sum);
    default: return DotRun<kBits, 4>(codes, code_stride, operands, operand_stride, count, with_code_sum, acc, code_sum);
  }
}

// The bit widths select the integer loops at run time (3 widths × 4 batch sizes), so the rest of the
// kernel is compiled once rather than once per (K bits, V bits) pair.
HWY_INLINE void DotRunAnyBits(int bits, int batch, const uint8_t* codes, size_t code_stride, const int32_t* operands,
                              size_t operand_stride, int count, bool with_code_sum, VI* acc, VI& code_sum) {
  switch (bits) {
    case 2: return DotRunBatch<2>(batch, codes, code_stride, operands, operand_stride, count, with_code_sum, acc, code_sum);
    case 4: return DotRunBatch<4>(batch, codes, code_stride, operands, operand_stride, count, with_code_sum, acc, code_sum);
    default: return DotRunBatch<8>(batch, codes, code_stride, operands, operand_stride, count, with_code_sum, acc, code_sum);
  }
}

// How far ahead of the block being read the next one is asked for, in blocks.
constexpr size_t kBlocksAhead = 1;

void AttendQuantized(const QuantizedBlockLayout& layout, std::span<const uint8_t* const> blocks, const QueryTile& tile,
                     AttentionPartials& partials, int first_partial) {
  const DI di;
  const DF df;
  const int lanes = int(hn::Lanes(di));
  const int tokens = layout.shape.block_tokens, k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  const int k_bits = layout.config.k_bits, v_bits = layout.config.v_bits;
  const bool stored_sums = layout.config.store_sums;

  const bool k_channel = layout.config.k_per_channel, v_token = layout.config.v_per_token;
  const int k_groups = layout.k_groups, v_groups = layout.v_groups;
  // Q' of the whole tile, from prepare_hack_queries (K per token).
  const auto* q_ops_all = reinterpret_cast<const int32_t*>(tile.prepared);
  const auto* q_meta_all = k_channel ? nullptr : reinterpret_cast<const Operand8*>(tile.prepared + size_t(tile.n_queries) * k_dim);
  // K per channel: from prepare_hack_queries, q̂ = q · 127 / max|q| [n_queries][k_dim] and max|q|
  // [n_queries][k_partitions]; per block, U' = lrint(q̂ ∘ ŝ) per token group [batch][k_groups][k_dim / 4],
  // its step per K partition [batch][k_groups][k_partitions], and the constant Σ_d q_d m_d
  // [batch][k_groups].
  const float* q_hat_all = k_channel ? reinterpret_cast<const float*>(tile.prepared) : nullptr;
  const float* q_max_all = k_channel ? q_hat_all + size_t(tile.n_queries) * k_dim : nullptr;
  thread_local std::vector<int32_t> u_ops;
  thread_local std::vector<float> u_step, k_constant;
  // P' (V per channel) or W' = lrint(w · 255 / max w) per column group (V per token): [batch][v_groups][tokens / 4],
  // P''s Operand8 [batch], and for V per token W''s step and the constant Σ_t p_t m_t [batch][v_groups].
  thread_local std::vector<int32_t> p_ops;
  thread_local std::vector<Operand8> p_meta;
  thread_local std::vector<float> scores, w_buffer, w_step, v_constant;  // scores, w: [batch][tokens]
  p_ops.resize(size_t(kQueryBatch) * v_groups * (tokens / 4));
  p_meta.resize(size_t(kQueryBatch));
  scores.resize(size_t(kQueryBatch) * tokens);
  if (k_channel) {
    u_ops.resize(size_t(kQueryBatch) * k_groups * (k_dim / 4));
    u_step.resize(size_t(kQueryBatch) * k_groups * layout.k_partitions);
    k_constant.resize(size_t(kQueryBatch) * k_groups);
  }
  if (v_token) {
    w_buffer.resize(size_t(kQueryBatch) * tokens);
    w_step.resize(size_t(kQueryBatch) * v_groups);
    v_constant.resize(size_t(kQueryBatch) * v_groups);
  }

  // What each iteration of the K and V loops asks for of the next block: the block over their
  // iterations, in whole lines.
  const int prefetch_slices = tokens / lanes * layout.k_partitions + v_dim / lanes;
  const size_t prefetch_step = (layout.block_bytes / size_t(prefetch_slices) + 63) / 64 * 64;
  for (size_t index = 0; index < blocks.size(); ++index) {
    const uint8_t* block = blocks[index];
    const auto* k_mins = reinterpret_cast<const uint16_t*>(block + layout.k_mins);
    const auto* k_scales = reinterpret_cast<const uint16_t*>(block + layout.k_scales);
    const auto* k_sums = reinterpret_cast<const int16_t*>(block + layout.k_sums);
    const auto* v_mins = reinterpret_cast<const uint16_t*>(block + layout.v_mins);
    const auto* v_scales = reinterpret_cast<const uint16_t*>(block + layout.v_scales);
    const auto* v_sums = reinterpret_cast<const int16_t*>(block + layout.v_sums);
    SpreadPrefetch ahead(index + kBlocksAhead < blocks.size() ? blocks[index + kBlocksAhead] : nullptr,
                         layout.block_bytes);
    for (int first = 0; first < tile.n_queries; first += kQueryBatch) {
      const int batch = std::min(kQueryBatch, tile.n_queries - first);
      int seen = 0;  // tokens any query of the batch sees
      for (int r = 0; r < batch; ++r) seen = std::max(seen, tile.visible[first + r]);
      if (seen == 0) continue;
      const int seen_chunks = (seen + lanes - 1) / lanes * lanes;
      const int32_t* q_ops = k_channel ? u_ops.data() : q_ops_all + size_t(first) * (k_dim / 4);
      const Operand8* q_meta = k_channel ? nullptr : q_meta_all + size_t(first) * layout.k_partitions;
      const size_t q_ops_stride = k_channel ? size_t(k_groups) * (k_dim / 4) : size_t(k_dim / 4);

      // K per channel: the block's scales fold into the queries, per token group and K partition (the
      // derivation: attention/hack_reference.cc): U' = lrint(q̂ ∘ ŝ) with ŝ = s / max s, whose range the
      // factors bound (no reduction over u), and the constant Σ_d q_d m_d. ŝ and m are widened once
      // for the batch's queries.
      if (k_channel) {
        for (int j = 0; j * layout.k_group_tokens < seen; ++j) {
          const size_t meta = size_t(j) * k_dim;
          VF constant[kQueryBatch];
          for (VF& c : constant) c = hn::Zero(df);
          for (int p = 0; p < layout.k_partitions; ++p) {
            const int dim0 = p * layout.k_partition, dims = layout.k_partition_dims(p);
            const float s_max = MaxOfHalves(k_scales + meta + dim0, dims);
            const VF s_factor = hn::Set(df, operand_factor(s_max, 1.0f));
            for (int r = 0; r < batch; ++r) {
              const float q_max = q_max_all[size_t(first + r) * layout.k_partitions + p];
              u_step[(size_t(r) * k_groups + j) * layout.k_partitions + p] = product_step(q_max, s_max, kULevels);
            }
            for (int d = dim0; d < dim0 + dims; d += lanes) {
              const VF s_hat = hn::Mul(LoadHalf(k_scales + meta + d), s_factor), min = LoadHalf(k_mins + meta + d);
              for (int r = 0; r < batch; ++r) {
                const size_t row = size_t(first + r) * k_dim + d;
                const VI u = RoundToInt(hn::Mul(hn::LoadU(df, q_hat_all + row), s_hat));
                StoreCodeBytes(u, reinterpret_cast<uint8_t*>(u_ops.data() + (size_t(r) * k_groups + j) * (k_dim / 4)) + d);
                constant[r] = hn::MulAdd(hn::LoadU(df, tile.q + row), min, constant[r]);
              }
            }
          }
          for (int r = 0; r < batch; ++r) k_constant[size_t(r) * k_groups + j] = hn::GetLane(hn::SumOfLanes(df, constant[r]));
        }
      }

      // Scores = Q'·K'ᵀ with Eq. 4's corrections, N tokens at a time, the batch's queries together.
      for (int t0 = 0; t0 < seen_chunks; t0 += lanes) {
        const int j = k_channel ? t0 / layout.k_group_tokens : 0;
        for (int p = 0; p < layout.k_partitions; ++p) {
          ahead.advance(prefetch_step);
          VI acc[kQueryBatch];
          VI code_sum;
          const int g_begin = p * layout.k_partition / 4, groups = layout.k_partition_dims(p) / 4;
          DotRunAnyBits(k_bits, batch, block + layout.k_codes + (size_t(g_begin) * tokens + t0) * (k_bits / 2),
                        size_t(tokens) * (k_bits / 2), q_ops + size_t(j) * (k_dim / 4) + g_begin, q_ops_stride, groups,
                        !stored_sums && !k_channel, acc, code_sum);
          const size_t slot = size_t(p) * tokens + t0;
          const VI k_sum = k_channel ? hn::Zero(di) : stored_sums ? LoadInt16(k_sums + slot) : code_sum;  // Σk' (HACK's)
          const VF k_sum_f = hn::ConvertTo(df, k_sum);
          const float dims = float(layout.k_partition_dims(p));
          for (int r = 0; r < batch; ++r) {
            VF term;
            if (k_channel) {  // Σ_d u_d k'_d + (once) Σ_d q_d m_d; U' is signed, not offset
              const size_t row = size_t(r) * k_groups + size_t(j);
              term = hn::Mul(hn::Set(df, u_step[row * layout.k_partitions + p]), hn::ConvertTo(df, acc[r]));
              if (p == 0) term = hn::Add(term, hn::Set(df, k_constant[row]));
            } else {
              const Operand8& q = q_meta[size_t(r) * layout.k_partitions + p];
              // Σ q'k' = Σ (q'-128) k' + 128 Σk'
              const VF dot = hn::ConvertTo(df, hn::Add(acc[r], hn::ShiftLeft<7>(k_sum)));
              const VF k_scale = LoadHalf(k_scales + slot), k_min = LoadHalf(k_mins + slot);
              term = hn::MulAdd(k_scale, hn::MulAdd(hn::Set(df, q.scale), dot, hn::Mul(hn::Set(df, q.min), k_sum_f)),
                                hn::Mul(k_min, hn::Set(df, q.scale * float(q.sum) + dims * q.min)));
            }
            float* s = scores.data() + size_t(r) * tokens + t0;
            hn::StoreU(p == 0 ? term : hn::Add(hn::LoadU(df, s), term), df, s);
          }
        }
      }

      // Online softmax: P = exp(score - running max), 0 where the query may not look; P' per block.
      // Each step runs for all of the batch's queries before the next step: the steps are short
      // dependency chains (horizontal max/min/sum, divisions, exp) that overlap only across queries.
      // Measured (4K context, 1 thread, decode): all steps per query, query after query, with an
      // out-of-line exp, was 1.13x slower; a single fused exp-and-quantize pass per query (P's range
      // from the score range), slower still.
      // The masks of visible tokens are FirstN (a bit mask from a count): Iota(t0) < visible built the lane
      // indices on the stack each time, and the vector load of those stores stalled (store forwarding).
      for (int r = 0; r < batch; ++r) {
        const int visible = tile.visible[first + r];
        if (visible == 0) continue;
        const float* s = scores.data() + size_t(r) * tokens;
        VF maxima = hn::Set(df, -INFINITY);
        for (int t0 = 0; t0 < visible; t0 += lanes) {
          const auto keep = hn::FirstN(df, size_t(std::max(visible - t0, 0)));
          maxima = hn::Max(maxima, hn::IfThenElse(keep, hn::LoadU(df, s + t0), hn::Set(df, -INFINITY)));
        }
        const int index = first_partial + first + r;
        partials.rescale(index, std::max(partials.max(index), hn::GetLane(hn::MaxOfLanes(df, maxima))));
      }
      // V per token also takes Σ_t p_t (the denominator, exact) as P is made.
      VF p_total[kQueryBatch];
      for (int r = 0; r < batch; ++r) {
        const int visible = tile.visible[first + r];
        float* s = scores.data() + size_t(r) * tokens;
        const VF running_max = hn::Set(df, partials.max(first_partial + first + r));
        p_total[r] = hn::Zero(df);
        for (int t0 = 0; t0 < tokens; t0 += lanes) {
          const auto keep = hn::FirstN(df, size_t(std::max(visible - t0, 0)));
          const VF e = hn::IfThenElseZero(keep, hn::Exp(df, hn::Sub(hn::LoadU(df, s + t0), running_max)));
          hn::StoreU(e, df, s + t0);
          if (v_token) p_total[r] = hn::Add(p_total[r], e);
        }
      }
      if (v_token) {
        // V per token: the denominator Σ_t p_t and the constant Σ_t p_t m_t exact; W' = lrint(w · 255 /
        // max w) per column group, w = p ∘ s ≥ 0, carries the codes' part (the derivation:
        // attention/hack_reference.cc). The group's scales and mins are widened once for the batch's
        // queries; w is kept for the second pass, once its max is known.
        for (int r = 0; r < batch; ++r) {
          const int index = first_partial + first + r;
          if (tile.visible[first + r] > 0) partials.sum(index) += hn::GetLane(hn::SumOfLanes(df, p_total[r]));
        }
        for (int g = 0; g < v_groups; ++g) {
          const size_t meta = size_t(g) * tokens;
          VF constant[kQueryBatch], largest[kQueryBatch];
          for (int r = 0; r < kQueryBatch; ++r) constant[r] = largest[r] = hn::Zero(df);
          for (int t0 = 0; t0 < tokens; t0 += lanes) {
            const VF scale = LoadHalf(v_scales + meta + t0), min = LoadHalf(v_mins + meta + t0);
            for (int r = 0; r < batch; ++r) {
              const VF pt = hn::LoadU(df, scores.data() + size_t(r) * tokens + t0), w = hn::Mul(pt, scale);
              hn::StoreU(w, df, w_buffer.data() + size_t(r) * tokens + t0);
              largest[r] = hn::Max(largest[r], w);
              constant[r] = hn::MulAdd(pt, min, constant[r]);
            }
          }
          for (int r = 0; r < batch; ++r) {
            const size_t row = size_t(r) * v_groups + size_t(g);
            const float w_max = hn::GetLane(hn::MaxOfLanes(df, largest[r]));
            const VF factor = hn::Set(df, operand_factor(w_max, kWLevels));
            auto* codes = reinterpret_cast<uint8_t*>(p_ops.data() + row * (tokens / 4));
            for (int t0 = 0; t0 < tokens; t0 += lanes) {
              const VI w = RoundToInt(hn::Mul(hn::LoadU(df, w_buffer.data() + size_t(r) * tokens + t0), factor));
              StoreCodeBytes(hn::Xor(w, hn::Set(di, 0x80)), codes + t0);
            }
            v_constant[row] = hn::GetLane(hn::SumOfLanes(df, constant[r]));
            w_step[row] = w_max / kWLevels;
          }
        }
      } else {
        for (int r = 0; r < batch; ++r) p_meta[size_t(r)] = Operand8Range(scores.data() + size_t(r) * tokens, tokens);
        for (int r = 0; r < batch; ++r) {
          QuantizeOperand8(scores.data() + size_t(r) * tokens, tokens, p_meta[size_t(r)], p_ops.data() + size_t(r) * (tokens / 4));
        }
        for (int r = 0; r < batch; ++r) {
          const int index = first_partial + first + r;
          const Operand8& p = p_meta[size_t(r)];
          if (tile.visible[first + r] > 0) partials.sum(index) += float(tokens) * p.min + p.scale * float(p.sum);
        }
      }

      // Output += P'·V' with Eq. 4's corrections, N columns at a time, the batch's queries together.
      for (int c0 = 0; c0 < v_dim; c0 += lanes) {
        VI acc[kQueryBatch];
        VI code_sum;
        const int g = v_token ? c0 / layout.v_group_dims : 0;
        ahead.advance(prefetch_step);
        DotRunAnyBits(v_bits, batch, block + layout.v_codes + size_t(c0) * (v_bits / 2), size_t(v_dim) * (v_bits / 2),
                      p_ops.data() + size_t(g) * (tokens / 4), size_t(v_groups) * (tokens / 4), tokens / 4, !stored_sums,
                      acc, code_sum);
        const VI v_sum = stored_sums ? LoadInt16(v_sums + c0) : code_sum;
        const VF v_sum_f = hn::ConvertTo(df, v_sum);
        for (int r = 0; r < batch; ++r) {
          if (tile.visible[first + r] == 0) continue;
          const VF dot = hn::ConvertTo(df, hn::Add(acc[r], hn::ShiftLeft<7>(v_sum)));
          VF term;
          if (v_token) {  // Σ_t w_t v'_t + Σ_t p_t m_t
            const size_t row = size_t(r) * v_groups + size_t(g);
            term = hn::MulAdd(hn::Set(df, w_step[row]), dot, hn::Set(df, v_constant[row]));
          } else {
            const Operand8& p = p_meta[size_t(r)];
            const VF v_scale = LoadHalf(v_scales + c0), v_min = LoadHalf(v_mins + c0);
            term = hn::MulAdd(v_scale, hn::MulAdd(hn::Set(df, p.scale), dot, hn::Mul(hn::Set(df, p.min), v_sum_f)),
                              hn::Mul(v_min, hn::Set(df, p.scale * float(p.sum) + float(tokens) * p.min)));
          }
          float* out = partials.acc(first_partial + first + r) + c0;
          hn::StoreU(hn::Add(hn::LoadU(df, out), term), df, out);
        }
      }
    }
    ahead.finish();
  }
}

void AttendHackBlocks(const QuantizedBlockLayout& layout, std::span<const uint8_t* const> blocks, const QueryTile& tile,
                      AttentionPartials& partials, int first_partial) {
  const int lanes = int(hn::Lanes(DI()));
  // The vector loops need whole vectors of tokens and of value columns; other shapes take the
  // reference path (correct, slow). Every shape slimkv builds (Π in {32, 64, 128}, head dims that are
  // multiples of 16) takes the vector path.
  // KIVI's layouts also need whole vectors per token group (K) and per column group (V), and K
  // partitions of whole vectors (U' is quantized with the vector code).
  const bool k_channel_fits = !layout.config.k_per_channel ||
                              (layout.k_group_tokens % lanes == 0 && layout.k_partition % lanes == 0 &&
                               layout.shape.k_dim % lanes == 0);
  const bool v_token_fits = !layout.config.v_per_token || layout.v_group_dims % lanes == 0;
  if (layout.shape.block_tokens % lanes != 0 || layout.shape.v_dim % lanes != 0 || lanes < 4 || !k_channel_fits ||
      !v_token_fits) {
    for (const uint8_t* block : blocks) attend_hack_block_reference(layout, block, tile, partials, first_partial);
    return;
  }
  AttendQuantized(layout, blocks, tile, partials, first_partial);
}

// Q' (K per token) into `prepared` as prepare_hack_queries lays it out, with the vector code of P':
// quantize_operand8's ranges, codes and sums exactly. False where a K partition is not whole vectors.
bool QuantizeQueries(const QuantizedBlockLayout& layout, const QueryTile& tile, uint8_t* prepared) {
  const int lanes = int(hn::Lanes(DF()));
  for (int p = 0; p < layout.k_partitions; ++p) {
    if (layout.k_partition_dims(p) % lanes != 0) return false;
  }
  const int k_dim = layout.shape.k_dim;
  auto* ops = reinterpret_cast<int32_t*>(prepared);
  auto* meta = reinterpret_cast<Operand8*>(prepared + size_t(tile.n_queries) * k_dim);
  for (int r = 0; r < tile.n_queries; ++r) {
    for (int p = 0; p < layout.k_partitions; ++p) {
      const int dim0 = p * layout.k_partition, dims = layout.k_partition_dims(p);
      const float* q = tile.q + size_t(r) * k_dim + dim0;
      Operand8& op = meta[size_t(r) * layout.k_partitions + p];
      op = Operand8Range(q, dims);
      QuantizeOperand8(q, dims, op, ops + (size_t(r) * k_dim + dim0) / 4);
    }
  }
  return true;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(AttendHackBlocks);
HWY_EXPORT(QuantizeQueries);

void prepare_hack_queries(const QuantizedBlockLayout& layout, const QueryTile& tile, std::vector<uint8_t>& prepared) {
  if (layout.config.k_per_channel) {  // U' folds each block's scales in: here q̂ = q · 127 / max|q| and max|q|
    const int k_dim = layout.shape.k_dim;
    prepared.resize(size_t(tile.n_queries) * (size_t(k_dim) + layout.k_partitions) * sizeof(float));
    auto* q_hat = reinterpret_cast<float*>(prepared.data());
    float* q_max = q_hat + size_t(tile.n_queries) * k_dim;
    for (int r = 0; r < tile.n_queries; ++r) {
      for (int p = 0; p < layout.k_partitions; ++p) {
        const int dim0 = p * layout.k_partition, dim1 = dim0 + layout.k_partition_dims(p);
        float largest = 0;
        for (int d = dim0; d < dim1; ++d) largest = std::max(largest, std::fabs(tile.q[size_t(r) * k_dim + d]));
        const float factor = operand_factor(largest, kULevels);
        for (int d = dim0; d < dim1; ++d) q_hat[size_t(r) * k_dim + d] = tile.q[size_t(r) * k_dim + d] * factor;
        q_max[size_t(r) * layout.k_partitions + p] = largest;
      }
    }
    return;
  }
  const int k_dim = layout.shape.k_dim, groups = k_dim / 4;
  prepared.resize(size_t(tile.n_queries) * (size_t(k_dim) + layout.k_partitions * sizeof(Operand8)));
  if (HWY_DYNAMIC_DISPATCH(QuantizeQueries)(layout, tile, prepared.data())) return;
  auto* ops = reinterpret_cast<int32_t*>(prepared.data());
  auto* meta = reinterpret_cast<Operand8*>(prepared.data() + size_t(tile.n_queries) * k_dim);
  std::vector<uint8_t> codes(static_cast<size_t>(k_dim));
  for (int r = 0; r < tile.n_queries; ++r) {
    const float* q = tile.q + size_t(r) * k_dim;
    for (int p = 0; p < layout.k_partitions; ++p) {
      const int dim0 = p * layout.k_partition;
      meta[size_t(r) * layout.k_partitions + p] = quantize_operand8(q + dim0, layout.k_partition_dims(p), codes.data() + dim0);
    }
    for (int g = 0; g < groups; ++g) {  // 4 codes per int32, offset by -128 (byte ^ 0x80)
      uint32_t packed = 0;
      for (int i = 0; i < 4; ++i) packed |= uint32_t(codes[size_t(4 * g + i)] ^ 0x80u) << (8 * i);
      ops[size_t(r) * groups + g] = int32_t(packed);
    }
  }
}
HWY_EXPORT(TargetName);

void attend_hack_blocks(const QuantizedBlockLayout& layout, std::span<const uint8_t* const> blocks, const QueryTile& tile,
                        AttentionPartials& partials, int first_partial) {
  HWY_DYNAMIC_DISPATCH(AttendHackBlocks)(layout, blocks, tile, partials, first_partial);
}

const char* hack_kernel_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace slimkv
#endif  // HWY_ONCE
