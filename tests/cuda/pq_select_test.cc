// PQCache's selection on the GPU (kv/cuda/pq_select.h, gpu_pq_kv.cc): the radix top-k (top_k_rows.h),
// one CTA per row and rows sliced over CTAs up to 512K scores, against a sort (kv/select/top_k.h's
// reference) on random, tied, all-equal and ±inf scores (NaNs: against the order of their bits); the
// whole selection (tables, ADC, top-k, exact re-rank, gather) against the CPU selector's steps (PqCodebook's reference table and score_codes,
// top_k_indices_reference, the exact re-rank of topk_selector.cc) on the same keys, queries and
// codebooks, over FP16 pages (and their token-major copies) and over sealed `hack` / `quant` blocks (the
// re-rank's keys and the gathered K/V dequantized as dequantize_tokens does, and their copies); and the
// bundled model: pq:topk=1.0 equals dense,
// @offload equals resident, pq:topk=1.0+hack equals hack, pq+hack@offload equals pq+hack resident.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include "cuda_test_util.h"
#include "golden_models.h"
#include "kv/cuda/pq_select.h"
#include "kv/cuda/pq_token_cache.h"
#include "kv/cuda/quantized_kv_pool.h"
#include "kv/select/pq_codebook.h"
#include "kv/select/top_k.h"
#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"
#include "tensor/quantized_block.h"
#include "util/half.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

using PqSelectTest = CudaTest;

// One top_k_rows launch: rows of scores filled one way, each row's n and k (per_length rows each), and
// max_n their longest, which picks one CTA per row (up to kTopKSlice) or rows cut into slices.
struct TopKCase {
  std::string fill;  // normal, tied (7 values, zeros of both signs), equal (every score 0.5), special (±inf, ±NaN, ±0)
  std::vector<int> ns, ks;
  int per_length = 1;
  std::string name() const {
    std::string lens;
    for (size_t i = 0; i < ns.size(); ++i) lens += str_cat(i ? "," : "", ns[i], ":", ks[i]);
    return str_cat("top_k(fill=", fill, ",n:k=", lens, ",per_length=", per_length, ")");
  }
};

float top_k_score(const std::string& fill, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> small(-3, 3), special(0, 63);
  if (fill == "tied") return small(rng) == 0 ? (rng() % 2 ? 0.0f : -0.0f) : float(small(rng));
  if (fill == "equal") return 0.5f;
  if (fill == "special") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    switch (special(rng)) {
      case 0: return inf;
      case 1: return -inf;
      case 2: return nan;
      case 3: return -nan;
      case 4: return 0.0f;
      case 5: return -0.0f;
      default: return normal(rng);
    }
  }
  return normal(rng);
}

// The GPU's order where top_k_indices_reference has none (NaN): by the scores' bits, +NaN above +inf and
// -NaN below -inf (zeros of both signs equal), then the lower index.
std::vector<int> top_k_by_bits(const float* scores, int n, int k) {
  const auto key = [&](int i) {
    uint32_t u = 0;
    const float f = scores[i] == 0.0f ? 0.0f : scores[i];
    std::memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  };
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return key(a) != key(b) ? key(a) > key(b) : a < b; });
  order.resize(size_t(k));
  std::sort(order.begin(), order.end());
  return order;
}

// "" when equal, else where the first difference is (a 512K-index row printed whole would drown it).
std::string first_difference(const std::vector<int>& got, const std::vector<int>& expected) {
  for (size_t i = 0; i < expected.size(); ++i) {
    if (got[i] != expected[i]) return str_cat("index ", i, " of ", expected.size(), ": got ", got[i], ", expected ", expected[i]);
  }
  return "";
}

TEST_F(PqSelectTest, TopKEqualsASortOnRandomAndTiedScores) {
  std::vector<TopKCase> cases;
  const std::vector<int> one_cta_ns = {1, 5, 1000, 4097, 8192, 3000, 8192}, one_cta_ks = {1, 5, 17, 4000, 1024, 0, 8192};
  std::vector<int> sliced_ns, sliced_ks;  // every n with k of 1, 7, 1024, 4096, 10000 (ties across a slice's end) and n
  for (int n : {8193, 70000, 131072, 524288}) {
    for (int k : {1, 7, 1024, 4096, 10000, n}) sliced_ns.push_back(n), sliced_ks.push_back(k);
  }
  sliced_ns.insert(sliced_ns.end(), {1, 200000, 5000}), sliced_ks.insert(sliced_ks.end(), {1, 0, 4096});
  for (const char* fill : {"normal", "tied", "equal", "special"}) {
    cases.push_back({fill, one_cta_ns, one_cta_ks});
    cases.push_back({fill, sliced_ns, sliced_ks});
  }
  // PQ's rows: KV heads of a sequence share n and k.
  cases.push_back({"normal", {100000, 30000}, {1280, 1024}, 2});
  cases.push_back({"tied", {100000, 30000}, {1280, 1024}, 2});
  std::mt19937 rng(7);
  for (const TopKCase& c : cases) {
    SCOPED_TRACE(c.name());
    const int rows = int(c.ns.size()) * c.per_length, stride = *std::max_element(c.ns.begin(), c.ns.end());
    std::vector<float> scores(size_t(rows) * size_t(stride));
    for (float& s : scores) s = top_k_score(c.fill, rng);
    auto d_scores = take(DeviceArray<float>::allocate(scores.size(), "scores"));
    auto d_n = take(DeviceArray<int>::allocate(c.ns.size(), "n")), d_k = take(DeviceArray<int>::allocate(c.ks.size(), "k"));
    auto d_out = take(DeviceArray<int>::allocate(scores.size(), "out"));
    auto d_scratch = take(DeviceArray<int>::allocate(top_k_scratch_ints(rows, stride), "scratch"));
    SLIMKV_ASSERT_OK(d_scores.upload(scores.data(), scores.size()));
    SLIMKV_ASSERT_OK(d_n.upload(c.ns.data(), c.ns.size()));
    SLIMKV_ASSERT_OK(d_k.upload(c.ks.data(), c.ks.size()));
    TopKRows launch;
    launch.scores = d_scores.data();
    launch.score_stride = stride;
    launch.n = d_n.data();
    launch.k = d_k.data();
    launch.per_length = c.per_length;
    launch.rows = rows;
    launch.max_n = stride;
    launch.out = d_out.data();
    launch.out_stride = stride;
    launch.scratch = d_scratch.data();
    SLIMKV_ASSERT_OK(top_k_rows(launch));
    std::vector<int> out(scores.size());
    SLIMKV_ASSERT_OK(d_out.download(out.data(), out.size()));
    for (int r = 0; r < rows; ++r) {
      const int n = c.ns[size_t(r / c.per_length)], k = std::min(c.ks[size_t(r / c.per_length)], n);
      const float* row = scores.data() + size_t(r) * size_t(stride);
      std::vector<int> expected(static_cast<size_t>(k));
      if (c.fill == "special") {
        expected = top_k_by_bits(row, n, k);
      } else {
        top_k_indices_reference(row, n, k, expected.data());
      }
      const std::vector<int> got(out.begin() + ptrdiff_t(r) * stride, out.begin() + ptrdiff_t(r) * stride + k);
      EXPECT_EQ(first_difference(got, expected), "") << "row " << r << " (n " << n << ", k " << k << ")";
    }
  }
}

// Token t's key row (pq_select.h's PqTokenRows, without its padding) from its sealed block in HACK's K
// layout: group c of its codes (b/2 bytes) at (c · 64 + t) · b/2, its partitions' mins and scales at
// the block's sections, slot j · 64 + t.
std::vector<uint8_t> key_row_reference(const QuantizedBlockLayout& layout, const uint8_t* block, int t, int d, int bits) {
  const QuantizedBlockOffsets offsets = quantized_block_offsets(layout);
  const int group_bytes = bits / 2, partitions = (d + kCudaBlockTokens - 1) / kCudaBlockTokens;
  std::vector<uint8_t> row;
  for (int c = 0; c < d / 4; ++c) {
    const uint8_t* group = block + (size_t(c) * kCudaBlockTokens + size_t(t)) * size_t(group_bytes);
    row.insert(row.end(), group, group + group_bytes);
  }
  for (const int section : {offsets.k_mins, offsets.k_scales}) {
    for (int j = 0; j < partitions; ++j) {
      const uint8_t* meta = block + section + 2 * (size_t(j) * kCudaBlockTokens + size_t(t));
      row.insert(row.end(), meta, meta + 2);
    }
  }
  return row;
}

// Token t's value row (pq_select.h's PqTokenRows, without its padding) from its sealed block: its code of
// column 4c + j, from the column's group of 4 tokens at ((t / 4) · d + 4c + j) · b/2 of the V codes, in
// field j of group c (b/2 bytes); with V per token, its column groups' mins and scales, slot g · 64 + t.
std::vector<uint8_t> value_row_reference(const QuantizedBlockLayout& layout, const uint8_t* block, int t, int d, int bits) {
  const QuantizedBlockOffsets offsets = quantized_block_offsets(layout);
  const int group_bytes = bits / 2;
  const auto read_group = [&](const uint8_t* at) {
    uint32_t value = 0;
    for (int b = 0; b < group_bytes; ++b) value |= uint32_t(at[b]) << (8 * b);
    return value;
  };
  std::vector<uint8_t> row;
  for (int c = 0; c < d / 4; ++c) {
    uint32_t packed = 0;
    for (int j = 0; j < 4; ++j) {
      const uint8_t* group = block + offsets.v_codes + (size_t(t / 4) * size_t(d) + size_t(4 * c + j)) * size_t(group_bytes);
      packed |= ((read_group(group) >> (t % 4 * bits)) & ((1u << bits) - 1u)) << (j * bits);
    }
    for (int b = 0; b < group_bytes; ++b) row.push_back(uint8_t(packed >> (8 * b)));
  }
  if (!layout.config.v_per_token) return row;
  for (const int section : {offsets.v_mins, offsets.v_scales}) {
    for (int g = 0; g < layout.v_groups; ++g) {
      const uint8_t* meta = block + section + 2 * (size_t(g) * kCudaBlockTokens + size_t(t));
      row.insert(row.end(), meta, meta + 2);
    }
  }
  return row;
}

// Sequences of `lengths` tokens keeping ks[s] of their middle tokens (rerank 1.25): random keys, GQA
// groups of 2, head_dim d. sealed: every full block also sealed in that config's blocks (quantize_block),
// which the selection reads instead of the pages for the tokens before each sequence's open block; then
// read again from the copies @offload makes (PqTokenRows, PqValueScales; without sealed: the pages'
// FP16 rows).
void expect_selection_equals_the_cpu_selectors(const std::vector<int>& lengths, const std::vector<int>& ks,
                                               const QuantizationConfig* sealed = nullptr, int d = 64) {
  const int heads = 4, kv_heads = 2, group = 2, m = 2, bits = 6, segment = 256;
  const int longest = *std::max_element(lengths.begin(), lengths.end());
  const int max_tokens = (longest + segment - 1) / segment * segment, blocks_per_seq = max_tokens / kCudaBlockTokens;
  const int max_segments = max_tokens / segment, K = 1 << bits, rows = int(lengths.size());
  std::mt19937 rng(11);
  std::vector<float> kf, vf, qf;
  const size_t pool = size_t(rows) * blocks_per_seq * kv_heads * kCudaBlockTokens * d;
  auto k_pool = random_halves(pool, 1.0f, rng, kf), v_pool = random_halves(pool, 1.0f, rng, vf);
  auto q = random_halves(size_t(rows) * heads * d, 1.0f, rng, qf);
  const auto at = [&](int s, int g, int t) {  // the paged layout, sequence s in blocks [s · blocks_per_seq, ...)
    return ((size_t(s * blocks_per_seq + t / kCudaBlockTokens) * kv_heads + size_t(g)) * kCudaBlockTokens +
            size_t(t % kCudaBlockTokens)) * d;
  };
  // Codebooks per (sequence, head, segment) trained on the CPU, as the cache's index does.
  std::vector<uint16_t> centroids(size_t(rows) * kv_heads * max_segments * d * K);
  std::vector<uint8_t> codes(size_t(rows) * kv_heads * max_tokens * m);
  std::vector<std::vector<PqCodebook>> books(size_t(rows * kv_heads));
  std::vector<PqSelectRow> host_rows;
  for (int s = 0; s < rows; ++s) {
    PqSelectRow r;
    r.sequence = s;
    r.num_tokens = lengths[size_t(s)];
    r.trained_segments = (r.num_tokens - 64) / segment;
    r.init_end = 4;
    r.middle_end = std::min(r.num_tokens - 64, r.trained_segments * segment);
    r.k = ks[size_t(s)];
    r.candidates = int(std::ceil(r.k * 1.25));
    r.selected = r.init_end + r.k + r.num_tokens - r.middle_end;
    host_rows.push_back(r);
    for (int g = 0; g < kv_heads; ++g) {
      for (int seg = 0; seg < r.trained_segments; ++seg) {
        std::vector<float> keys;
        for (int t = seg * segment; t < (seg + 1) * segment; ++t) keys.insert(keys.end(), kf.begin() + ptrdiff_t(at(s, g, t)), kf.begin() + ptrdiff_t(at(s, g, t) + d));
        PqCodebook book(d, m, bits);
        book.train(keys.data(), segment, 4, uint64_t(seg + 1));
        book.encode(keys.data(), segment, codes.data() + ((size_t(s) * kv_heads + g) * max_tokens + size_t(seg) * segment) * m);
        std::copy(book.centroids().begin(), book.centroids().end(),
                  centroids.begin() + ptrdiff_t(((size_t(s) * kv_heads + g) * max_segments + seg) * d * K));
        books[size_t(s * kv_heads + g)].push_back(book);
      }
    }
  }
  // The GPU.
  auto d_k = take(DeviceArray<uint16_t>::allocate(pool, "k")), d_v = take(DeviceArray<uint16_t>::allocate(pool, "v"));
  auto d_q = take(DeviceArray<uint16_t>::allocate(q.size(), "q"));
  auto d_centroids = take(DeviceArray<uint16_t>::allocate(centroids.size(), "c"));
  auto d_codes = take(DeviceArray<uint8_t>::allocate(codes.size(), "codes"));
  SLIMKV_ASSERT_OK(d_k.upload(k_pool.data(), pool));
  SLIMKV_ASSERT_OK(d_v.upload(v_pool.data(), pool));
  SLIMKV_ASSERT_OK(d_q.upload(q.data(), q.size()));
  SLIMKV_ASSERT_OK(d_centroids.upload(centroids.data(), centroids.size()));
  SLIMKV_ASSERT_OK(d_codes.upload(codes.data(), codes.size()));
  std::vector<int> tables(size_t(rows) * blocks_per_seq);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = int(i);
  auto d_tables = take(DeviceArray<int>::allocate(tables.size(), "tables"));
  SLIMKV_ASSERT_OK(d_tables.upload(tables.data(), tables.size()));
  auto d_rows = take(DeviceArray<PqSelectRow>::allocate(host_rows.size(), "rows"));
  SLIMKV_ASSERT_OK(d_rows.upload(host_rows.data(), host_rows.size()));
  std::vector<int> lens(4 * size_t(rows));
  for (int r = 0; r < rows; ++r) {
    const PqSelectRow& x = host_rows[size_t(r)];
    lens[size_t(r)] = x.middle_end - x.init_end;
    lens[size_t(rows + r)] = lens[size_t(2 * rows + r)] = x.candidates;
    lens[size_t(3 * rows + r)] = x.k;
  }
  auto d_lens = take(DeviceArray<int>::allocate(lens.size(), "lengths"));
  SLIMKV_ASSERT_OK(d_lens.upload(lens.data(), lens.size()));
  int max_cand = 0;
  for (const PqSelectRow& r : host_rows) max_cand = std::max(max_cand, r.candidates);
  const int out_blocks = blocks_per_seq;
  const size_t rh = size_t(rows) * kv_heads;
  auto t_tables = take(DeviceArray<float>::allocate(rh * max_segments * m * K, "t"));
  auto t_scores = take(DeviceArray<float>::allocate(rh * max_tokens, "s"));
  auto t_ranked = take(DeviceArray<int>::allocate(rh * max_cand, "r")), t_kept = take(DeviceArray<int>::allocate(rh * max_cand, "k"));
  auto t_exact = take(DeviceArray<float>::allocate(rh * max_cand, "e"));
  auto t_keys = take(DeviceArray<uint16_t>::allocate(rh * max_cand * d, "keys"));
  auto out_k = take(DeviceArray<uint16_t>::allocate(pool, "ok")), out_v = take(DeviceArray<uint16_t>::allocate(pool, "ov"));
  PqSelectLaunch launch;
  launch.rows = d_rows.data();
  launch.num_rows = rows;
  for (const PqSelectRow& r : host_rows) {
    launch.max_trained_segments = std::max(launch.max_trained_segments, r.trained_segments);
    launch.max_middle = std::max(launch.max_middle, r.middle_end - r.init_end);
    launch.max_candidates = std::max(launch.max_candidates, r.candidates);
    launch.max_selected = std::max(launch.max_selected, r.selected);
  }
  launch.q = d_q.data();
  launch.num_heads = heads;
  launch.num_kv_heads = kv_heads;
  launch.index = PqIndexView{d_centroids.data(), d_codes.data(), m, bits, d, segment, max_segments, max_tokens};
  launch.source = PagedKvView{d_k.data(), d_v.data(), d_tables.data(), blocks_per_seq, kv_heads, d};
  auto t_top_k = take(DeviceArray<int>::allocate(top_k_scratch_ints(int(rh), max_tokens), "top-k scratch"));
  launch.scratch = PqSelectScratch{t_tables.data(), t_scores.data(), t_ranked.data(), t_exact.data(), t_keys.data(),
                                   t_kept.data(), d_lens.data(), t_top_k.data(), max_tokens, max_cand};
  launch.out_k = out_k.data();
  launch.out_v = out_v.data();
  launch.out_blocks_per_row = out_blocks;
  // The sealed blocks [rows · blocks_per_seq, kv_heads, block_bytes] (the pages' block ids), and every
  // sealed token's K/V dequantized: what the selection must read of them.
  std::optional<QuantizedBlockLayout> layout;
  DeviceArray<uint8_t> d_sealed;
  std::vector<uint8_t> blocks;
  if (sealed != nullptr) {
    layout.emplace(*sealed, BlockShape{kCudaBlockTokens, d, d});
    const size_t block_bytes = layout->block_bytes, page = size_t(kCudaBlockTokens) * d;
    blocks.resize(size_t(rows) * blocks_per_seq * kv_heads * block_bytes);
    std::vector<float> k_block(page), v_block(page);
    for (int s = 0; s < rows; ++s) {
      for (int b = 0; b < lengths[size_t(s)] / kCudaBlockTokens; ++b) {
        for (int g = 0; g < kv_heads; ++g) {
          const size_t first = at(s, g, b * kCudaBlockTokens);
          std::copy(kf.begin() + ptrdiff_t(first), kf.begin() + ptrdiff_t(first + page), k_block.begin());
          std::copy(vf.begin() + ptrdiff_t(first), vf.begin() + ptrdiff_t(first + page), v_block.begin());
          uint8_t* block = blocks.data() + (size_t(s * blocks_per_seq + b) * kv_heads + size_t(g)) * block_bytes;
          quantize_block(*layout, k_block.data(), v_block.data(), uint64_t(1000 * s + 10 * b + g), block);
          std::vector<float> k_out(page), v_out(page);
          dequantize_block(*layout, block, k_out.data(), v_out.data());
          std::copy(k_out.begin(), k_out.end(), kf.begin() + ptrdiff_t(first));
          std::copy(v_out.begin(), v_out.end(), vf.begin() + ptrdiff_t(first));
        }
      }
    }
    d_sealed = take(DeviceArray<uint8_t>::allocate(blocks.size(), "sealed blocks"));
    SLIMKV_ASSERT_OK(d_sealed.upload(blocks.data(), blocks.size()));
    QuantizedKvView& view = launch.sealed;
    view.blocks = d_sealed.data();
    view.block_tables = d_tables.data();
    view.k_bits = sealed->k_bits;
    view.v_bits = sealed->v_bits;
    view.offsets = quantized_block_offsets(*layout);
    view.k_per_channel = sealed->k_per_channel;
    view.v_per_token = sealed->v_per_token;
    view.k_group_tokens = layout->k_group_tokens;
    view.v_group_dims = layout->v_group_dims;
  }
  // What the gather writes of token t: the page's FP16, or the sealed token dequantized and rounded.
  const auto stored = [&](const std::vector<uint16_t>& page, const std::vector<float>& decoded, int s, size_t i) {
    const int block = int(i / (size_t(d) * kCudaBlockTokens * kv_heads)) % blocks_per_seq;
    const int t = block * kCudaBlockTokens + int(i / size_t(d)) % kCudaBlockTokens;
    return sealed != nullptr && t < lengths[size_t(s)] / kCudaBlockTokens * kCudaBlockTokens ? float_to_fp16(decoded[i]) : page[i];
  };
  SLIMKV_ASSERT_OK(pq_select_and_gather(launch));
  std::vector<uint16_t> got_k(pool), got_v(pool);
  SLIMKV_ASSERT_OK(out_k.download(got_k.data(), pool));
  SLIMKV_ASSERT_OK(out_v.download(got_v.data(), pool));
  // The CPU selector's steps.
  for (int s = 0; s < rows; ++s) {
    const PqSelectRow& r = host_rows[size_t(s)];
    for (int g = 0; g < kv_heads; ++g) {
      std::vector<float> qsum(size_t(d), 0.0f);
      for (int h = 0; h < group; ++h) {
        for (int c = 0; c < d; ++c) qsum[size_t(c)] += qf[(size_t(s) * heads + size_t(g * group + h)) * d + size_t(c)];
      }
      const int middle = r.middle_end - r.init_end;
      std::vector<float> scores(static_cast<size_t>(middle)), table(static_cast<size_t>(m * K));
      for (int seg = 0; seg * segment < r.middle_end; ++seg) {
        const PqCodebook& book = books[size_t(s * kv_heads + g)][size_t(seg)];
        book.score_table_reference(qsum.data(), table.data());
        const int first = std::max(r.init_end, seg * segment), last = std::min(r.middle_end, (seg + 1) * segment);
        book.score_codes(table.data(), codes.data() + ((size_t(s) * kv_heads + g) * max_tokens + size_t(first)) * m,
                         last - first, scores.data() + (first - r.init_end));
      }
      std::vector<int> candidates(static_cast<size_t>(r.candidates)), kept(static_cast<size_t>(r.k));
      top_k_indices_reference(scores.data(), middle, r.candidates, candidates.data());
      std::vector<float> exact(static_cast<size_t>(r.candidates));
      for (int i = 0; i < r.candidates; ++i) {
        double sum = 0;
        const size_t key = at(s, g, candidates[size_t(i)] + r.init_end);
        for (int c = 0; c < d; ++c) sum += double(qsum[size_t(c)]) * double(kf[key + size_t(c)]);
        exact[size_t(i)] = float(sum);
      }
      top_k_indices_reference(exact.data(), r.candidates, r.k, kept.data());
      std::vector<int> expected;
      for (int t = 0; t < r.init_end; ++t) expected.push_back(t);
      for (int i : kept) expected.push_back(candidates[size_t(i)] + r.init_end);
      for (int t = r.middle_end; t < r.num_tokens; ++t) expected.push_back(t);
      ASSERT_EQ(int(expected.size()), r.selected);
      int mismatches = 0;
      for (int i = 0; i < r.selected; ++i) {
        const size_t from = at(s, g, expected[size_t(i)]), to = at(s, g, i);
        for (int c = 0; c < d; ++c) {
          mismatches += got_k[to + size_t(c)] != stored(k_pool, kf, s, from + size_t(c)) ||
                        got_v[to + size_t(c)] != stored(v_pool, vf, s, from + size_t(c));
        }
      }
      EXPECT_EQ(mismatches, 0) << "sequence " << s << ", KV head " << g;
    }
  }
  const auto sealed_tokens = [&](int s) { return lengths[size_t(s)] / kCudaBlockTokens * kCudaBlockTokens; };
  // @offload's copies of FP16 pages (pq_copy_sealed into pq_fp16_row_copies): each full block's token's
  // row, its key then its value, against the pages; then the pages' full blocks overwritten with NaNs, so
  // that only the open tokens can still be read there, and the selection over the rows: the same K/V as
  // from the pages, bit for bit.
  if (sealed == nullptr) {
    const int row_bytes = pq_fp16_row_bytes(d);
    auto d_fp16_rows = take(DeviceArray<uint8_t>::allocate(size_t(rows) * kv_heads * max_tokens * row_bytes, "FP16 rows"));
    launch.copies = pq_fp16_row_copies(d_fp16_rows.data(), d, max_tokens);
    for (int s = 0; s < rows; ++s) {
      SLIMKV_ASSERT_OK(pq_copy_sealed({QuantizedKvView{}, blocks_per_seq, kv_heads, d, s, 0, sealed_tokens(s), launch.source},
                                      launch.copies));
    }
    const std::vector<uint8_t> got_rows = on_host(d_fp16_rows);
    std::vector<uint16_t> poisoned_k = k_pool, poisoned_v = v_pool;
    int mismatches = 0;
    for (int s = 0; s < rows; ++s) {
      for (int g = 0; g < kv_heads; ++g) {
        for (int t = 0; t < sealed_tokens(s); ++t) {
          const uint8_t* row = got_rows.data() + ((size_t(s) * kv_heads + size_t(g)) * max_tokens + size_t(t)) * row_bytes;
          mismatches += std::memcmp(row, k_pool.data() + at(s, g, t), 2 * size_t(d)) != 0 ||
                        std::memcmp(row + 2 * d, v_pool.data() + at(s, g, t), 2 * size_t(d)) != 0;
          std::fill_n(poisoned_k.begin() + ptrdiff_t(at(s, g, t)), d, uint16_t(0x7fff));
          std::fill_n(poisoned_v.begin() + ptrdiff_t(at(s, g, t)), d, uint16_t(0x7fff));
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << "FP16 rows unlike their pages";
    SLIMKV_ASSERT_OK(d_k.upload(poisoned_k.data(), pool));
    SLIMKV_ASSERT_OK(d_v.upload(poisoned_v.data(), pool));
    SLIMKV_ASSERT_OK(pq_select_and_gather(launch));
    std::vector<uint16_t> rows_k(pool), rows_v(pool);
    SLIMKV_ASSERT_OK(out_k.download(rows_k.data(), pool));
    SLIMKV_ASSERT_OK(out_v.download(rows_v.data(), pool));
    EXPECT_TRUE(rows_k == got_k && rows_v == got_v) << "the selection over the FP16 rows differs from the one over the pages";
    return;
  }
  // @offload's copies of sealed bytes (pq_copy_sealed): the keys (HACK's K layout) and values in
  // token-major rows, and the blocks' per-column V scales (HACK's V layout), each against its block's
  // bytes, and the selection reading them: the same K/V as from the blocks alone, bit for bit.
  const auto block_of = [&](int s, int g, int t) {
    return blocks.data() + (size_t(s * blocks_per_seq + t / kCudaBlockTokens) * kv_heads + size_t(g)) * layout->block_bytes;
  };
  DeviceArray<uint8_t> d_key_rows;
  if (!sealed->k_per_channel) {
    const int row_bytes = pq_key_row_bytes(d, sealed->k_bits);
    d_key_rows = take(DeviceArray<uint8_t>::allocate(size_t(rows) * kv_heads * max_tokens * row_bytes, "key rows"));
    launch.copies.key_rows = PqTokenRows{d_key_rows.data(), row_bytes, max_tokens};
  }
  const int value_row_bytes = pq_value_row_bytes(d, sealed->v_bits, sealed->v_per_token ? layout->v_groups : 0);
  auto d_value_rows = take(DeviceArray<uint8_t>::allocate(size_t(rows) * kv_heads * max_tokens * value_row_bytes, "value rows"));
  launch.copies.value_rows = PqTokenRows{d_value_rows.data(), value_row_bytes, max_tokens};
  DeviceArray<uint16_t> d_value_scales;
  if (!sealed->v_per_token) {
    d_value_scales = take(DeviceArray<uint16_t>::allocate(size_t(rows) * kv_heads * blocks_per_seq * 2 * d, "V scales"));
    launch.copies.value_scales = PqValueScales{d_value_scales.data(), blocks_per_seq};
  }
  for (int s = 0; s < rows; ++s) {
    SLIMKV_ASSERT_OK(
        pq_copy_sealed({launch.sealed, blocks_per_seq, kv_heads, d, s, 0, sealed_tokens(s), PagedKvView{}}, launch.copies));
  }
  // Each sealed token's row of `got_rows` against `reference(block, token in block)`: the mismatching rows.
  const auto rows_unlike = [&](const std::vector<uint8_t>& got_rows, size_t row_bytes, const auto& reference) {
    int mismatches = 0;
    for (int s = 0; s < rows; ++s) {
      for (int g = 0; g < kv_heads; ++g) {
        for (int t = 0; t < sealed_tokens(s); ++t) {
          const std::vector<uint8_t> expected = reference(block_of(s, g, t), t % kCudaBlockTokens);
          const uint8_t* row = got_rows.data() + ((size_t(s) * kv_heads + size_t(g)) * max_tokens + size_t(t)) * row_bytes;
          mismatches += !std::equal(expected.begin(), expected.end(), row);
        }
      }
    }
    return mismatches;
  };
  if (!sealed->k_per_channel) {
    EXPECT_EQ(rows_unlike(on_host(d_key_rows), size_t(launch.copies.key_rows.row_bytes),
                          [&](auto block, int token) { return key_row_reference(*layout, block, token, d, sealed->k_bits); }),
              0)
        << "key rows unlike their blocks' bytes";
  }
  EXPECT_EQ(rows_unlike(on_host(d_value_rows), size_t(value_row_bytes),
                        [&](auto block, int token) { return value_row_reference(*layout, block, token, d, sealed->v_bits); }),
            0)
      << "value rows unlike their blocks' bytes";
  if (!sealed->v_per_token) {
    const std::vector<uint16_t> got_scales = on_host(d_value_scales);
    const QuantizedBlockOffsets offsets = quantized_block_offsets(*layout);
    int mismatches = 0;
    for (int s = 0; s < rows; ++s) {
      for (int g = 0; g < kv_heads; ++g) {
        for (int b = 0; b < sealed_tokens(s) / kCudaBlockTokens; ++b) {
          const uint8_t* block = block_of(s, g, b * kCudaBlockTokens);
          const uint8_t* copy = reinterpret_cast<const uint8_t*>(
              got_scales.data() + ((size_t(s) * kv_heads + size_t(g)) * blocks_per_seq + size_t(b)) * 2 * d);
          mismatches += !std::equal(block + offsets.v_mins, block + offsets.v_mins + 2 * d, copy);
          mismatches += !std::equal(block + offsets.v_scales, block + offsets.v_scales + 2 * d, copy + 2 * d);
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << "V scale copies unlike their blocks' bytes";
  }
  SLIMKV_ASSERT_OK(pq_select_and_gather(launch));
  std::vector<uint16_t> copies_k(pool), copies_v(pool);
  SLIMKV_ASSERT_OK(out_k.download(copies_k.data(), pool));
  SLIMKV_ASSERT_OK(out_v.download(copies_v.data(), pool));
  EXPECT_TRUE(copies_k == got_k && copies_v == got_v) << "the selection over the copies differs from the one over the blocks";
}

// Short rows (each top-k one CTA a row), and long ones: the ADC select sliced (middles of 19708 and
// 8700 tokens), and the exact one too (8750 candidates); head_dim 128 with a sequence ending inside a
// block. Each again from @offload's token-major copies of the pages (the pages' full blocks then NaNs).
TEST_F(PqSelectTest, SelectionEqualsTheCpuSelectorsOnTheSameCodebooks) {
  {
    SCOPED_TRACE("lengths 1500, 900");
    expect_selection_equals_the_cpu_selectors({1500, 900}, {100, 150});
  }
  {
    SCOPED_TRACE("lengths 20000, 9000");
    expect_selection_equals_the_cpu_selectors({20000, 9000}, {7000, 1024});
  }
  {
    SCOPED_TRACE("lengths 1500, 931, head_dim 128");
    expect_selection_equals_the_cpu_selectors({1500, 931}, {100, 150}, nullptr, 128);
  }
}

// The same over sealed blocks (pq:...+hack / +quant): HACK's layout at 2 bits, KIVI's (K per channel in
// groups of 16 tokens, V per token in groups of 32 columns) at 4, K per channel over the block and V per
// token in groups of 2 columns at 2, and 8 bits; lengths ending inside a block (its open tokens read
// from the pages); K per channel with HACK's V, and HACK's K with V per token. Then again from the
// copies @offload reads: the values' token-major rows, where K is HACK's (per token partition) the keys',
// where V is the blocks' V scales; and at head_dim 128 (two K partitions).
TEST_F(PqSelectTest, SelectionOverSealedBlocksEqualsTheCpuSelectorsOnDequantizedKeys) {
  QuantizationConfig hack2;
  QuantizationConfig kivi4;
  kivi4.k_bits = kivi4.v_bits = 4;
  kivi4.k_per_channel = kivi4.v_per_token = true;
  kivi4.k_group = 16;
  kivi4.v_group = 32;
  QuantizationConfig pairs2;
  pairs2.k_per_channel = pairs2.v_per_token = true;
  pairs2.v_group = 2;
  QuantizationConfig nearest8;
  nearest8.k_bits = nearest8.v_bits = 8;
  nearest8.rounding = Rounding::kNearest;
  QuantizationConfig k_channel2;
  k_channel2.k_per_channel = true;
  QuantizationConfig v_token2;
  v_token2.v_per_token = true;
  for (const auto& [name, config] : {std::pair{"hack bits=2", hack2}, std::pair{"kivi bits=4", kivi4},
                                     std::pair{"bits=2 vgroup=2", pairs2}, std::pair{"bits=8 nearest", nearest8},
                                     std::pair{"bits=2 klayout=channel", k_channel2},
                                     std::pair{"bits=2 vlayout=token", v_token2}}) {
    SCOPED_TRACE(name);
    expect_selection_equals_the_cpu_selectors({1500, 931}, {100, 150}, &config);
  }
  SCOPED_TRACE("hack bits=2, head_dim 128 (two K partitions)");
  expect_selection_equals_the_cpu_selectors({1500, 931}, {100, 150}, &hack2, 128);
}

// The bundled model on the GPU: a prompt of 1200 held-out tokens (4 clustered segments), then greedy
// decode steps. pq:topk=1.0 selects every token, through the selection's gather (@offload: from
// host memory): logits equal dense's. pq:topk=0.3@offload equals pq:topk=0.3 resident (the same
// selection, read from host memory instead, or from its GPU cache of selected tokens: of the default
// size, smaller than a selection, or none), and selects about 0.3 of the tokens.
TEST_F(PqSelectTest, BundledModelTopkOneEqualsDenseAndOffloadEqualsResident) {
  const std::string dir = slimkv::test::source_dir() + "/models/slimkv-llama-15m";
  const auto load = [&](const std::string& kv) {
    EngineConfig config;
    config.model_dir = dir;
    config.kv_spec = kv;
    config.device = "cuda";
    config.threads = 2;
    config.max_sequences = 2;
    return take(Engine::load(config));
  };
  auto dense = load("dense");
  std::ifstream in(dir + "/heldout.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.resize(6000);
  std::vector<int32_t> prompt = dense->tokenizer()->encode(text, true);
  prompt.resize(1200);
  const auto run = [&](Engine& engine) {
    auto session = engine.new_session();
    std::vector<std::vector<float>> rows;
    auto logits = take(session->prefill(prompt));
    for (int step = 0; step < 12; ++step) {
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      logits = take(session->decode(next));
      rows.push_back(logits);
    }
    return rows;
  };
  const auto expected = run(*dense);
  for (const char* spec : {"pq:topk=1.0", "pq:topk=1.0@offload"}) {
    auto engine = load(spec);
    EXPECT_TRUE(run(*engine) == expected) << spec;
  }
  // @offload reads the tokens it finds in its GPU cache from there: the default cache (larger than the
  // selection), a smaller one that evicts (LFU), and none; the others from the pages (rows=auto over
  // FP16), or with rows=on from the full blocks' token-major copies.
  auto resident = load("pq:topk=0.3");
  const auto selected = run(*resident);
  for (const char* spec : {"pq:topk=0.3@offload", "pq:topk=0.3,cache=96,policy=lfu@offload", "pq:topk=0.3,cache=0@offload",
                           "pq:topk=0.3,cache=0,rows=on@offload"}) {
    auto offload = load(spec);
    EXPECT_TRUE(run(*offload) == selected) << spec;
  }
  EXPECT_FALSE(selected == expected);  // the selection changes the logits

  // Over sealed hack blocks (rot=hadamard by default: the model turns q, k, v; the index clusters the
  // turned keys, as the CPU's): topk=1.0 resident selects nothing and attends as hack does; the
  // selection read from host memory, or its GPU cache, equals the resident one.
  auto hack = load("hack:bits=4");
  auto all = load("pq:topk=1.0+hack:bits=4");
  EXPECT_TRUE(run(*all) == run(*hack)) << "pq:topk=1.0+hack:bits=4";
  for (const auto& [resident_spec, offload_spec] : std::vector<std::pair<std::string, std::string>>{
           {"pq:topk=0.3+hack:bits=4", "pq:topk=0.3+hack:bits=4@offload"},
           {"pq:topk=0.3+hack:bits=4", "pq:topk=0.3,cache=96,policy=lfu+hack:bits=4@offload"},
           {"pq:topk=0.3+hack:bits=2,rot=none", "pq:topk=0.3,cache=0+hack:bits=2,rot=none@offload"},
           {"pq:topk=0.3+hack:bits=4", "pq:topk=0.3,cache=0,rows=off+hack:bits=4@offload"}}) {
    auto resident_hack = load(resident_spec), offload_hack = load(offload_spec);
    EXPECT_TRUE(run(*offload_hack) == run(*resident_hack)) << offload_spec;
  }
  auto hack_resident = load("pq:topk=0.3+hack:bits=4");
  const auto hack_selected = run(*hack_resident);
  EXPECT_FALSE(hack_selected == run(*hack));
}

// pq+hack on the GPU against the CPU engine's, fed the same tokens: the logits as close as hack's alone
// on the two devices allow (BF16 activations on the GPU move the keys, so a few selected tokens may
// differ), printed beside it.
TEST_F(PqSelectTest, BundledModelPqOverHackIsCloseToTheCpu) {
  const std::string dir = slimkv::test::source_dir() + "/models/slimkv-llama-15m";
  const auto load = [&](const std::string& kv, const char* device) {
    EngineConfig config;
    config.model_dir = dir;
    config.kv_spec = kv;
    config.device = device;
    config.threads = 2;
    config.max_sequences = 1;
    return take(Engine::load(config));
  };
  std::ifstream in(dir + "/heldout.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.resize(6000);
  double errors[2] = {0, 0};
  const char* specs[2] = {"hack:bits=4", "pq:topk=0.3+hack:bits=4"};
  for (int i = 0; i < 2; ++i) {
    auto gpu = load(specs[i], "cuda"), cpu = load(specs[i], "cpu");
    std::vector<int32_t> prompt = cpu->tokenizer()->encode(text, true);
    prompt.resize(1200);
    auto gpu_session = gpu->new_session(), cpu_session = cpu->new_session();
    auto gpu_logits = take(gpu_session->prefill(prompt)), cpu_logits = take(cpu_session->prefill(prompt));
    for (int step = 0; step < 8; ++step) {
      errors[i] = std::max(errors[i], relative_max_error(gpu_logits, cpu_logits));
      const int32_t next = int32_t(std::max_element(cpu_logits.begin(), cpu_logits.end()) - cpu_logits.begin());
      gpu_logits = take(gpu_session->decode(next));
      cpu_logits = take(cpu_session->decode(next));
    }
  }
  std::printf("GPU against CPU, max error / max|logit|: %s %.2e, %s %.2e\n", specs[0], errors[0], specs[1], errors[1]);
  EXPECT_LT(errors[1], std::max(5e-2, 3 * errors[0]));
}

// A GPU cache larger than the policy's sort allows is refused at load, naming the option and its range.
TEST_F(PqSelectTest, BundledModelRefusesACacheOutOfRange) {
  EngineConfig config;
  config.model_dir = slimkv::test::source_dir() + "/models/slimkv-llama-15m";
  config.kv_spec = str_cat("pq:topk=0.3,cache=", kPqCacheMaxSlots + 1, "@offload");
  config.device = "cuda";
  config.max_sequences = 1;
  const auto engine = Engine::load(config);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find(str_cat("cache=", kPqCacheMaxSlots + 1, ": ")), std::string::npos)
      << engine.status().message();
  EXPECT_NE(engine.status().message().find(str_cat("1 to ", kPqCacheMaxSlots)), std::string::npos);
}

}  // namespace
}  // namespace slimkv::cuda
