// The FP32 block kernel (every dense block and every codec's open block) against the online-softmax
// fold computed in FP64 from its definition: tiles wider than the kernel's query batch, queries that
// see nothing, part or all of the block, head dims with and without a vector tail, all-negative scores,
// and partials that already hold earlier tokens; the FP16/BF16 kernel against the FP32 one; and a run of
// blocks in one call (what the dense codec reads) against the same blocks one call each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention/cpu/dense_block_attention.h"
#include "attention/partial.h"
#include "tensor/block_shape.h"
#include "tensor/dtype.h"
#include "util/half.h"

namespace slimkv {
namespace {

struct Fold {  // one query's state in FP64
  double max = -INFINITY, sum = 0;
  std::vector<double> acc;
};

void fold(Fold& f, const std::vector<double>& scores, const float* v, int v_dim) {
  double block_max = -INFINITY;
  for (double s : scores) block_max = std::max(block_max, s);
  if (scores.empty()) return;
  const double new_max = std::max(f.max, block_max);
  const double factor = std::isinf(f.max) ? 0.0 : std::exp(f.max - new_max);
  f.sum *= factor;
  for (double& a : f.acc) a *= factor;
  for (size_t j = 0; j < scores.size(); ++j) {
    const double w = std::exp(scores[j] - new_max);
    f.sum += w;
    for (int c = 0; c < v_dim; ++c) f.acc[size_t(c)] += w * v[j * size_t(v_dim) + size_t(c)];
  }
  f.max = new_max;
}

void check(int tokens, int k_dim, int v_dim, const std::vector<int>& visible, float score_shift, bool scored) {
  SCOPED_TRACE(testing::Message() << "tokens " << tokens << " k_dim " << k_dim << " v_dim " << v_dim
                                  << " shift " << score_shift << (scored ? " (scores given)" : ""));
  const int queries = int(visible.size());
  std::mt19937 rng(uint32_t(tokens * 131 + k_dim * 7 + v_dim));
  std::normal_distribution<float> normal;
  auto fill = [&](size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng);
    return x;
  };
  std::vector<float> q = fill(size_t(queries) * k_dim), k = fill(size_t(tokens) * k_dim),
                     v = fill(size_t(tokens) * v_dim), earlier_v = fill(size_t(5) * v_dim);
  // One appended constant dim shifts every score by score_shift (e.g. all far below 0).
  for (int i = 0; i < queries; ++i) q[size_t(i) * k_dim + size_t(k_dim - 1)] = score_shift;
  for (int j = 0; j < tokens; ++j) k[size_t(j) * k_dim + size_t(k_dim - 1)] = 1.0f;

  AttentionPartials partials(queries, v_dim);
  std::vector<Fold> expected(size_t(queries), Fold{-INFINITY, 0, std::vector<double>(size_t(v_dim), 0.0)});
  for (int i = 0; i < queries; i += 2) {  // every other partial already holds 5 earlier tokens
    std::vector<double> earlier = {0.5, -1.0, 2.0, 0.0, 1.5};
    fold(expected[size_t(i)], earlier, earlier_v.data(), v_dim);
    partials.max(i) = float(expected[size_t(i)].max);
    partials.sum(i) = float(expected[size_t(i)].sum);
    for (int c = 0; c < v_dim; ++c) partials.acc(i)[c] = float(expected[size_t(i)].acc[size_t(c)]);
  }
  std::vector<double> dots(size_t(queries) * tokens);
  for (int i = 0; i < queries; ++i) {
    for (int j = 0; j < tokens; ++j) {
      double dot = 0;
      for (int c = 0; c < k_dim; ++c) dot += double(q[size_t(i) * k_dim + size_t(c)]) * k[size_t(j) * k_dim + size_t(c)];
      dots[size_t(i) * tokens + size_t(j)] = dot;
    }
    const int n = scored ? tokens : visible[size_t(i)];
    std::vector<double> scores(dots.begin() + i * tokens, dots.begin() + i * tokens + std::max(n, 0));
    fold(expected[size_t(i)], scores, v.data(), v_dim);
  }

  if (scored) {
    std::vector<float> given(size_t(tokens) * queries);  // [tokens, queries], unscaled
    for (int i = 0; i < queries; ++i) {
      for (int j = 0; j < tokens; ++j) given[size_t(j) * queries + size_t(i)] = float(dots[size_t(i) * tokens + size_t(j)] / 0.5);
    }
    attend_scored_f32(given.data(), 0.5f, queries, v.data(), tokens, v_dim, partials);
  } else {
    const QueryTile tile{q.data(), queries, visible.data()};
    attend_block_f32(tile, k.data(), v.data(), k_dim, v_dim, partials);
  }

  // FP32 scores of magnitude |shift| carry an absolute error of about |shift|·2^-24 per term, which the
  // softmax weights inherit relatively.
  const double tolerance = 1e-5 + 5e-7 * std::abs(score_shift);
  for (int i = 0; i < queries; ++i) {
    const Fold& f = expected[size_t(i)];
    if (f.sum == 0) {
      EXPECT_EQ(partials.sum(i), 0.0f) << "query " << i << " saw nothing";
      continue;
    }
    EXPECT_NEAR(partials.max(i), f.max, 1e-4 * (1 + std::abs(f.max))) << "query " << i;
    EXPECT_NEAR(partials.sum(i) / f.sum, 1.0, tolerance) << "query " << i;
    for (int c = 0; c < v_dim; ++c) {
      EXPECT_NEAR(partials.acc(i)[c] / f.sum, f.acc[size_t(c)] / f.sum, tolerance) << "query " << i << " column " << c;
    }
  }
}

TEST(DenseBlockAttention, MatchesTheFoldInDoubles) {
  const std::vector<int> mixed = {0, 1, 64, 5, 0, 63, 17, 64, 33};  // 9 queries: batches of 4, 4 and 1
  check(64, 128, 128, mixed, 0.0f, false);
  check(64, 40, 24, mixed, 0.0f, false);     // vector tails in both dims
  check(64, 128, 128, mixed, -300.0f, false);  // every score far below 0
  check(64, 20, 72, mixed, 40.0f, false);
  check(1, 16, 16, {1, 0, 1}, 0.0f, false);
  check(256, 64, 80, {256, 200, 0, 1, 255}, -5.0f, false);
  check(3, 8, 4, {3, 2, 1, 0}, 0.0f, false);  // narrower than a vector
  check(64, 128, 128, std::vector<int>(7, 64), 0.0f, true);
  check(37, 24, 40, std::vector<int>(5, 37), -200.0f, true);
}

// FP16/BF16 blocks (dense:dtype=f16/bf16) read by the kernel that widens in registers: the very bits the
// FP32 kernel (held to FP64 above) gives over the same rows widened first.
TEST(DenseBlockAttention, HalfBlocksGiveTheBitsOfTheirWidenedRows) {
  struct Shape {
    int tokens, k_dim, v_dim;
    std::vector<int> visible;
  };
  const std::vector<Shape> shapes = {{64, 128, 128, {0, 1, 64, 5, 0, 63, 17, 64, 33}},
                                     {64, 40, 24, {64, 3, 0}},  // vector tails in both dims
                                     {37, 24, 40, {37, 37, 20, 1, 37}},
                                     {37, 128, 64, {37, 36, 0, 37, 5}},  // keys past the last whole vector of keys
                                     {3, 8, 4, {3, 2, 1, 0}}};  // narrower than a vector
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " tokens " << shape.tokens << " k_dim " << shape.k_dim
                                      << " v_dim " << shape.v_dim);
      const int queries = int(shape.visible.size());
      std::mt19937 rng(uint32_t(shape.tokens * 17 + shape.k_dim));
      std::normal_distribution<float> normal;
      const auto narrow = dtype == DType::kBF16 ? float_to_bf16 : float_to_fp16;
      const auto widen = dtype == DType::kBF16 ? bf16_to_float : fp16_to_float;
      std::vector<float> q(size_t(queries) * shape.k_dim);
      for (float& e : q) e = normal(rng);
      std::vector<uint16_t> k16(size_t(shape.tokens) * shape.k_dim), v16(size_t(shape.tokens) * shape.v_dim);
      for (uint16_t& e : k16) e = narrow(normal(rng) * 3);
      for (uint16_t& e : v16) e = narrow(normal(rng));
      std::vector<float> k(k16.size()), v(v16.size());
      for (size_t i = 0; i < k.size(); ++i) k[i] = widen(k16[i]);
      for (size_t i = 0; i < v.size(); ++i) v[i] = widen(v16[i]);
      AttentionPartials half(queries, shape.v_dim), wide(queries, shape.v_dim);
      for (int i = 0; i < queries; i += 2) {  // some partials already hold earlier tokens
        for (AttentionPartials* p : {&half, &wide}) {
          p->max(i) = 1.5f;
          p->sum(i) = 2.0f;
          for (int c = 0; c < shape.v_dim; ++c) p->acc(i)[c] = 0.25f * float(c % 7);
        }
      }
      const QueryTile tile{q.data(), queries, shape.visible.data()};
      attend_block_half(tile, k16.data(), v16.data(), dtype, shape.k_dim, shape.v_dim, half);
      attend_block_f32(tile, k.data(), v.data(), shape.k_dim, shape.v_dim, wide);
      for (int i = 0; i < queries; ++i) {
        ASSERT_EQ(half.max(i), wide.max(i)) << "query " << i;
        ASSERT_EQ(half.sum(i), wide.sum(i)) << "query " << i;
        for (int c = 0; c < shape.v_dim; ++c) ASSERT_EQ(half.acc(i)[c], wide.acc(i)[c]) << "query " << i << " column " << c;
      }
    }
  }
}

// A run of blocks in one call (attend_dense_blocks, which asks for the next block as it reads one) gives
// the bits of the same blocks passed one at a time to the single-block kernels (held above to FP64 and
// to the widened rows), for every dtype, tiles of 1 to 9 queries (every query batch size) and head dims
// with and without a vector tail.
TEST(DenseBlockAttention, ARunGivesTheBitsOfItsBlocksOneByOne) {
  struct Case {
    int tokens, k_dim, v_dim, blocks;
    std::vector<int> visible;
  };
  const std::vector<Case> cases = {{64, 128, 128, 4, {64, 64}},  // a decode tile of a GQA group of 2
                                   {64, 128, 128, 3, {64}},
                                   {64, 128, 128, 3, {64, 64, 64}},
                                   {64, 128, 128, 2, {64, 0, 64, 64, 64, 64, 64, 64, 64}},
                                   {32, 64, 256, 3, {32, 32, 32, 32}},
                                   {64, 40, 24, 3, {64, 64, 64}},  // vector tails in both dims
                                   {37, 128, 64, 2, {37, 37}},     // keys past the last whole vector of keys
                                   {16, 128, 128, 1, {16, 16}}};
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const Case& c : cases) {
      const int queries = int(c.visible.size());
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " tokens " << c.tokens << " k_dim " << c.k_dim
                                      << " v_dim " << c.v_dim << " blocks " << c.blocks << " queries " << queries);
      std::mt19937 rng(uint32_t(c.tokens * 7 + c.k_dim * 3 + c.blocks + queries));
      std::normal_distribution<float> normal;
      const BlockShape shape{c.tokens, c.k_dim, c.v_dim};
      const size_t element = dtype_size_bytes(dtype);
      const size_t k_values = size_t(c.tokens) * size_t(c.k_dim), v_values = size_t(c.tokens) * size_t(c.v_dim);
      const size_t block_bytes = (k_values + v_values) * element;
      // Blocks apart in a pool, in an order other than the pool's (as a store's blocks are).
      std::vector<uint8_t> pool(block_bytes * size_t(c.blocks) * 2);
      std::vector<const uint8_t*> run;
      for (int b = 0; b < c.blocks; ++b) {
        uint8_t* block = pool.data() + block_bytes * size_t(2 * (c.blocks - 1 - b) + 1);
        for (size_t i = 0; i < k_values + v_values; ++i) {
          const float x = normal(rng) * (i < k_values ? 3.0f : 1.0f);
          if (dtype == DType::kF32) {
            std::memcpy(block + i * 4, &x, 4);
          } else {
            const uint16_t h = dtype == DType::kBF16 ? float_to_bf16(x) : float_to_fp16(x);
            std::memcpy(block + i * 2, &h, 2);
          }
        }
        run.push_back(block);
      }
      std::vector<float> q(size_t(queries) * c.k_dim);
      for (float& e : q) e = normal(rng) * 0.2f;
      AttentionPartials one_call(queries, c.v_dim), block_by_block(queries, c.v_dim);
      const QueryTile tile{q.data(), queries, c.visible.data()};
      attend_dense_blocks(run, dtype, shape, tile, one_call);
      for (const uint8_t* block : run) {
        if (dtype == DType::kF32) {
          const auto* k = reinterpret_cast<const float*>(block);
          attend_block_f32(tile, k, k + k_values, c.k_dim, c.v_dim, block_by_block);
        } else {
          const auto* k = reinterpret_cast<const uint16_t*>(block);
          attend_block_half(tile, k, k + k_values, dtype, c.k_dim, c.v_dim, block_by_block);
        }
      }
      for (int i = 0; i < queries; ++i) {
        ASSERT_EQ(one_call.max(i), block_by_block.max(i)) << "query " << i;
        ASSERT_EQ(one_call.sum(i), block_by_block.sum(i)) << "query " << i;
        for (int col = 0; col < c.v_dim; ++col) {
          ASSERT_EQ(one_call.acc(i)[col], block_by_block.acc(i)[col]) << "query " << i << " column " << col;
        }
      }
    }
  }
}

}  // namespace
}  // namespace slimkv
