// rot=hadamard: an orthonormal involution; attention through a rotated store equals attention through
// a plain one; and at 2 bits it lowers the error where K has outlier channels (real models' K does).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "kv/kv_factory.h"
#include "kv/rotation.h"
#include "kv/store_attention.h"

namespace slimkv {
namespace {

TEST(Hadamard, IsAnOrthonormalInvolutionForEveryDim) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (int n : {1, 2, 3, 16, 64, 80, 96, 128, 136}) {
    SCOPED_TRACE(n);
    std::vector<float> x(static_cast<size_t>(n)), y;
    for (float& e : x) e = normal(rng);
    y = x;
    hadamard_rotate(y.data(), n);
    double norm_x = 0, norm_y = 0;
    for (int i = 0; i < n; ++i) {
      norm_x += double(x[size_t(i)]) * x[size_t(i)];
      norm_y += double(y[size_t(i)]) * y[size_t(i)];
    }
    EXPECT_NEAR(norm_y, norm_x, 1e-5 * norm_x);
    hadamard_rotate(y.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(y[size_t(i)], x[size_t(i)], 1e-5);
  }
  // A one-hot vector spreads evenly over a power-of-two head: that is what flattens outliers.
  std::vector<float> e(128, 0.0f);
  e[5] = 1.0f;
  hadamard_rotate(e.data(), 128);
  for (float v : e) EXPECT_NEAR(std::fabs(v), 1.0f / std::sqrt(128.0f), 1e-6);
}

// The transform as the textbook loop writes it: stages of butterflies at distance 1, 2, 4, ..., then the
// scale; power-of-two chunks, largest first.
void hadamard_plain(float* x, int n) {
  int done = 0;
  for (int chunk = 1 << 30; chunk >= 1; chunk /= 2) {
    for (; n - done >= chunk; done += chunk) {
      float* c = x + done;
      for (int half = 1; half < chunk; half *= 2) {
        for (int start = 0; start < chunk; start += 2 * half) {
          for (int i = start; i < start + half; ++i) {
            const float a = c[i], b = c[i + half];
            c[i] = a + b;
            c[i + half] = a - b;
          }
        }
      }
      const float scale = 1.0f / std::sqrt(float(chunk));
      for (int i = 0; i < chunk; ++i) c[i] *= scale;
    }
  }
}

// The vector stages (butterflies across lanes within a vector, then between vectors) add in the plain
// loop's order: the same bits, for every length the chunks can take.
TEST(Hadamard, GivesThePlainLoopsBits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int n = 1; n <= 300; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = normal(rng);
    std::vector<float> expected = x;
    hadamard_plain(expected.data(), n);
    hadamard_rotate(x.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(x[size_t(i)], expected[size_t(i)]) << "n " << n << " element " << i;
  }
}

struct Data {
  int n = 256, heads = 8, kv_heads = 2, d = 128;
  std::vector<float> q, k, v, exact;
};

Data make_data(float outlier_scale) {
  Data data;
  std::mt19937 rng(77);
  std::normal_distribution<float> normal;
  data.q.resize(size_t(data.n) * data.heads * data.d);
  data.k.resize(size_t(data.n) * data.kv_heads * data.d);
  data.v.resize(data.k.size());
  for (float& e : data.q) e = normal(rng);
  for (float& e : data.v) e = normal(rng);
  for (size_t i = 0; i < data.k.size(); ++i) {
    const int channel = int(i % size_t(data.d));
    data.k[i] = normal(rng) * (channel % 32 == 3 ? outlier_scale : 1.0f);  // 4 outlier channels per head
  }
  std::vector<int> positions(static_cast<size_t>(data.n));
  for (int i = 0; i < data.n; ++i) positions[size_t(i)] = i;
  data.exact.resize(data.q.size());
  attention_reference(data.q.data(), data.n, positions.data(), data.k.data(), data.v.data(), data.n, data.heads,
                      data.kv_heads, data.d, data.d, 1.0f / std::sqrt(float(data.d)), data.exact.data());
  return data;
}

double nmse_vs_exact(const Data& data, const std::string& spec) {
  auto pipeline = make_kv_pipeline(spec);
  EXPECT_TRUE(pipeline) << pipeline.status().message();
  KvStore store({1, data.kv_heads, data.d, data.d, data.n}, *pipeline);
  store.append(0, data.k.data(), data.v.data(), data.n);
  std::vector<float> out(data.q.size());
  ThreadPool pool(2);
  attend(store, 0, data.q.data(), data.n, 0, {data.heads, 1.0f / std::sqrt(float(data.d)), &pool}, out.data());
  double e = 0, r = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    e += double(out[i] - data.exact[i]) * (out[i] - data.exact[i]);
    r += double(data.exact[i]) * data.exact[i];
  }
  return e / r;
}

TEST(Hadamard, RotatedDenseStoreGivesTheSameAttention) {
  const Data data = make_data(1.0f);
  EXPECT_LT(nmse_vs_exact(data, "dense:rot=hadamard"), 1e-10);
  EXPECT_LT(nmse_vs_exact(data, "dense:rot=hadamard,block=16"), 1e-10);
}

TEST(Hadamard, LowersTwoBitErrorWhenKeysHaveOutlierChannels) {
  const Data data = make_data(8.0f);
  const double plain = nmse_vs_exact(data, "hack:bits=2,rot=none,prefill=quantized"),
               rotated = nmse_vs_exact(data, "hack:bits=2,rot=hadamard,prefill=quantized");
  const double plain4 = nmse_vs_exact(data, "hack:bits=4,rot=none,prefill=quantized"),
               rotated4 = nmse_vs_exact(data, "hack:bits=4,rot=hadamard,prefill=quantized");
  std::printf("NMSE vs exact with outlier K channels: 2-bit %.3e → rotated %.3e; 4-bit %.3e → rotated %.3e\n", plain,
              rotated, plain4, rotated4);
  EXPECT_LT(rotated, 0.7 * plain);
  EXPECT_LT(rotated4, 0.7 * plain4);
}

}  // namespace
}  // namespace slimkv
