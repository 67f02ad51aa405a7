// The experts' grouped GEMV (backend/cuda/expert_gemv.h) against the plain reference: each place's
// input row times its expert's rows (dequantize_reference's, or the plain values) in FP64, for every
// block type and plain FP16/BF16 experts, FP16 and BF16 inputs. Beyond the reference, exactly (bit for
// bit): each expert's outputs are quantized_gemv's of its rows alone (the same loop), and a row's
// outputs do not change when it runs without the other rows of the step (issue 22: a sequence's output
// does not depend on its neighbours). Places are made by expert_plan_reference.h, the plan's own test
// holding the device's plan to it; the experts hold 0, 1, a few and more than 8 rows (an expert's places
// run 8 at a time). The gated variant (W_gate|W_up and the activation in one launch) bit for bit
// against the product followed by the activation kernel; the W_down variant that sums each row's
// outputs as it finishes bit for bit against the product followed by add_weighted_rows.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/expert_gemv.h"
#include "backend/cuda/expert_routing.h"
#include "backend/cuda/layer_kernels.h"
#include "cuda_test_util.h"
#include "expert_plan_reference.h"
#include "weight_blocks_util.h"

namespace slimkv::cuda {
namespace {

constexpr double kFp32Unit = 1.0 / (1 << 24);  // FP32's unit roundoff

struct GroupedCase {
  BlockQuant quant;  // kNone: plain rows in dtype
  DType dtype;       // of the inputs (and of plain weights)
  int experts, rows, cols, n, k;
  bool gathered;  // inputs read through the plan's row_of_place (W_gate|W_up) or one row per place (W_down)
  // Bytes of other matrices between two experts' (a model's arena holds each expert's W_gate|W_up, then
  // its W_down: the stride spans both).
  size_t gap_bytes = 0;
  std::string name() const {
    return str_cat("grouped_gemv(", quant == BlockQuant::kNone ? "plain" : block_quant_name(quant), ",x=",
                   dtype_name(dtype), ",experts=", experts, ",rows=", rows, ",cols=", cols, ",n=", n, ",k=", k,
                   gathered ? ",gathered" : ",by place", ",gap=", gap_bytes, ")");
  }
};

// Every expert's matrix [rows, cols] on the device, each in a slot of stride_bytes (as a model's arena
// lays them out: the matrix, up to 256-byte alignment, then gap_bytes), with each expert's values for the
// reference. What lies between the matrices is 0xff bytes: NaN scales and values wherever a kernel strays.
struct Experts {
  DeviceArray<uint8_t> memory;
  ExpertMatrices matrices;
  std::vector<std::vector<float>> values;  // [experts][rows · cols]
};

Experts make_experts(const GroupedCase& c, std::mt19937& rng) {
  Experts out;
  const bool plain = c.quant == BlockQuant::kNone;
  const size_t bytes = plain ? size_t(c.rows) * size_t(c.cols) * 2 : quantized_matrix_bytes(c.quant, c.rows, c.cols);
  const size_t stride = (bytes + 255) / 256 * 256 + c.gap_bytes;
  out.memory = take(DeviceArray<uint8_t>::allocate(stride * size_t(c.experts), "test experts"));
  EXPECT_TRUE(device_fill_bytes(out.memory.data(), 0xff, out.memory.bytes()).is_ok());
  for (int e = 0; e < c.experts; ++e) {
    void* at = out.memory.data() + size_t(e) * stride;
    std::vector<float> w(size_t(c.rows) * size_t(c.cols));
    DeviceMatrix m;
    if (plain) {
      const std::vector<uint16_t> bits = random_inputs(w.size(), c.dtype, rng, w, 0.05f);
      EXPECT_TRUE(copy_to_device(at, bits.data(), bits.size() * 2).is_ok());
      m.data = at;
      m.dtype = c.dtype;
      m.rows = c.rows;
      m.cols = c.cols;
    } else {
      const std::vector<uint8_t> blocks = random_blocks(c.quant, c.rows, c.cols, rng);
      m = quantized_matrix_at(at, c.quant, c.rows, c.cols);
      EXPECT_TRUE(upload_quantized(blocks.data(), m).is_ok());
      dequantize_reference(c.quant, blocks.data(), w.data(), int64_t(w.size()));
    }
    if (e == 0) out.matrices = {m, stride, c.experts};
    out.values.push_back(std::move(w));
  }
  return out;
}

// Row t's k experts: expert 1 for every row (more than 8 rows where n > 8), the others at random
// among experts 2 .. experts - 1 (expert 0 none).
std::vector<int32_t> choices_of(const GroupedCase& c, std::mt19937& rng) {
  std::vector<int32_t> expert_of;
  std::vector<int32_t> others(size_t(c.experts - 2));
  std::iota(others.begin(), others.end(), 2);
  for (int t = 0; t < c.n; ++t) {
    std::shuffle(others.begin(), others.end(), rng);
    expert_of.push_back(1);
    for (int j = 1; j < c.k; ++j) expert_of.push_back(others[size_t(j - 1)]);
  }
  return expert_of;
}

// y [places, rows + 3] from grouped_expert_gemv over `plan_values` (columns past rows hold guards).
std::vector<float> run_grouped(const GroupedCase& c, const Experts& experts, const DeviceArray<uint16_t>& x,
                               const std::vector<int32_t>& plan_values, int choices) {
  auto plan_device = on_device(plan_values);
  const ExpertRowsPlan plan = expert_plan_at(plan_device.data(), choices, c.experts);
  const int64_t stride = c.rows + 3;
  auto y = on_device(std::vector<float>(size_t(choices) * size_t(stride), -3.0f));
  const Status status = grouped_expert_gemv(x.data(), c.gathered ? plan.row_of_place : nullptr, c.dtype,
                                            experts.matrices, plan, expert_slots(choices, c.experts), y.data(), stride);
  EXPECT_TRUE(status.is_ok()) << status.message();
  return on_host(y);
}

void check_case(const GroupedCase& c) {
  SCOPED_TRACE(c.name());
  const unsigned seed = unsigned(int(c.quant) * 1009 + int(c.dtype) * 101 + c.n * 7 + c.cols + (c.gathered ? 1 : 0));
  SCOPED_TRACE(str_cat("seed ", seed));
  std::mt19937 rng(seed);
  const Experts experts = make_experts(c, rng);
  const std::vector<int32_t> expert_of = choices_of(c, rng);
  const int choices = c.n * c.k;
  std::vector<int32_t> plan = expert_plan_reference(expert_of, c.k, c.experts, 0);
  const ExpertRowsPlan places = expert_plan_at(plan.data(), choices, c.experts);  // the layout the device reads
  const int32_t* row_of_place = places.row_of_place;
  const int32_t* first_place = places.first_place;
  // Inputs: the step's rows [n, cols] (gathered through row_of_place), or one row per place.
  const int input_rows = c.gathered ? c.n : choices;
  std::vector<float> x;
  const std::vector<uint16_t> x_bits = random_inputs(size_t(input_rows) * size_t(c.cols), c.dtype, rng, x);
  auto x_device = on_device(x_bits);
  const std::vector<float> y = run_grouped(c, experts, x_device, plan, choices);
  const int64_t stride = c.rows + 3;

  // The reference: FP64 products; the bound γ_(cols + 6) Σ|x·w| holds any order of FP32 sums.
  const auto gamma = [](double k) { return k * kFp32Unit / (1 - k * kFp32Unit); };
  for (int e = 0; e < c.experts; ++e) {
    for (int p = first_place[e]; p < first_place[e + 1]; ++p) {
      const float* input = x.data() + size_t(c.gathered ? row_of_place[p] : p) * size_t(c.cols);
      for (int o = 0; o < c.rows; ++o) {
        const float* w = experts.values[size_t(e)].data() + size_t(o) * size_t(c.cols);
        double sum = 0, magnitude = 0;
        for (int col = 0; col < c.cols; ++col) {
          sum += double(input[col]) * double(w[col]);
          magnitude += std::fabs(double(input[col]) * double(w[col]));
        }
        const float got = y[size_t(p) * size_t(stride) + size_t(o)];
        ASSERT_LE(std::fabs(double(got) - sum), gamma(c.cols + 6) * magnitude)
            << "place " << p << " (expert " << e << "), row " << o << ": GPU " << got << ", reference " << sum;
      }
      for (int64_t o = c.rows; o < stride; ++o) {
        ASSERT_EQ(y[size_t(p) * size_t(stride) + size_t(o)], -3.0f) << "place " << p << ": column " << o << " written";
      }
    }
  }

  // Each expert's outputs are quantized_gemv's of its rows alone, bit for bit.
  if (c.quant != BlockQuant::kNone) {
    for (int e = 0; e < c.experts; ++e) {
      const int first = first_place[e], count = first_place[e + 1] - first;
      if (count == 0) continue;
      std::vector<uint16_t> rows_of_e;
      for (int p = first; p < first + count; ++p) {
        const size_t row = size_t(c.gathered ? row_of_place[p] : p) * size_t(c.cols);
        rows_of_e.insert(rows_of_e.end(), x_bits.begin() + ptrdiff_t(row), x_bits.begin() + ptrdiff_t(row + size_t(c.cols)));
      }
      auto rows_device = on_device(rows_of_e);
      auto alone = on_device(std::vector<float>(size_t(count) * size_t(c.rows), 0.0f));
      SLIMKV_ASSERT_OK(quantized_gemv(rows_device.data(), count, c.dtype, experts.matrices.expert(e), alone.data(),
                                      false, c.rows));
      const std::vector<float> want = on_host(alone);
      for (int i = 0; i < count; ++i) {
        for (int o = 0; o < c.rows; ++o) {
          ASSERT_EQ(y[size_t(first + i) * size_t(stride) + size_t(o)], want[size_t(i) * size_t(c.rows) + size_t(o)])
              << "expert " << e << " row " << i << " of " << count << ", output " << o;
        }
      }
    }
  }

  // Row n - 1 alone (its choices only): the same outputs, bit for bit.
  if (c.gathered && c.n > 1) {
    const int last = c.n - 1;
    const std::vector<int32_t> own(expert_of.begin() + ptrdiff_t(last * c.k), expert_of.end());
    std::vector<int32_t> own_plan = expert_plan_reference(own, c.k, c.experts, 0);
    const std::vector<uint16_t> own_x(x_bits.begin() + ptrdiff_t(size_t(last) * size_t(c.cols)), x_bits.end());
    auto own_x_device = on_device(own_x);
    const std::vector<float> own_y = run_grouped(c, experts, own_x_device, own_plan, c.k);
    const int32_t* own_place_of_choice = expert_plan_at(own_plan.data(), c.k, c.experts).place_of_choice;
    const int32_t* place_of_choice = places.place_of_choice;
    for (int j = 0; j < c.k; ++j) {
      const size_t alone_at = size_t(own_place_of_choice[j]) * size_t(stride);
      const size_t batch_at = size_t(place_of_choice[last * c.k + j]) * size_t(stride);
      for (int o = 0; o < c.rows; ++o) {
        ASSERT_EQ(own_y[alone_at + size_t(o)], y[batch_at + size_t(o)]) << "choice " << j << ", output " << o;
      }
    }
  }
}

using MoeGroupedGemv = CudaTest;

// Every block type and plain rows, FP16 and BF16 inputs; a decode row, a few, and 20 (expert 1 then
// holds 20 rows: three runs of 8); 37 output rows (a CTA cut short); rows 1 and 8 units wide (plain:
// 48 values, Qwen3-MoE's golden experts, and 264).
TEST_F(MoeGroupedGemv, MatchesTheReferenceAndEachExpertAlone) {
  for (BlockQuant quant : {BlockQuant::kQ8_0, BlockQuant::kQ4_0, BlockQuant::kQ4_K, BlockQuant::kQ6_K, BlockQuant::kNone}) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      const bool k_quant = quant == BlockQuant::kQ4_K || quant == BlockQuant::kQ6_K;
      const std::vector<int> widths = quant == BlockQuant::kNone ? std::vector<int>{48, 264}
                                      : k_quant                   ? std::vector<int>{256, 512}
                                                                  : std::vector<int>{32, 256};
      for (int cols : widths) {
        for (int n : {1, 3, 20}) {
          for (bool gathered : {true, false}) {
            check_case({quant, dtype, 7, 37, cols, n, 3, gathered});
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// The Q8_0 (and Q4_0) Qwen3-MoE fixture's experts as the model's arena holds them: hidden 32, expert_inter
// 32, each expert's W_gate|W_up [64, 32] and then its W_down [32, 32] in one stride, 4 experts, 2 a row;
// a 20-row step (expert 1 holds every row: runs of 8, 8 and 4), its W_gate|W_up rows gathered and its W_down
// rows one a place.
TEST_F(MoeGroupedGemv, ExpertsLaidOutAsTheModelsArena) {
  const auto aligned_bytes = [](BlockQuant quant, int rows, int cols) {
    return (quantized_matrix_bytes(quant, rows, cols) + 255) / 256 * 256;
  };
  for (BlockQuant quant : {BlockQuant::kQ8_0, BlockQuant::kQ4_0}) {
    check_case({quant, DType::kF16, 4, 64, 32, 20, 2, /*gathered=*/true, aligned_bytes(quant, 32, 32)});
    if (HasFatalFailure()) return;
    check_case({quant, DType::kF16, 4, 32, 32, 20, 2, /*gathered=*/false, aligned_bytes(quant, 64, 32)});
    if (HasFatalFailure()) return;
  }
}

// W_gate|W_up with the activation applied as the products are written: the same bits as the grouped
// product followed by gated_activation (held to its loop by CudaLayerTest), every kind, both activations,
// a decode row and 20 (expert 1 then holds 20 rows); 40 intermediate columns (a CTA cut short).
TEST_F(MoeGroupedGemv, GatedEqualsTheProductThenTheActivation) {
  const int intermediate = 40;
  for (BlockQuant quant : {BlockQuant::kQ8_0, BlockQuant::kQ4_0, BlockQuant::kQ4_K, BlockQuant::kQ6_K, BlockQuant::kNone}) {
    const bool k_quant = quant == BlockQuant::kQ4_K || quant == BlockQuant::kQ6_K;
    const int cols = quant == BlockQuant::kNone ? 48 : k_quant ? 256 : 64;
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      for (GateActivation activation : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
        for (int n : {1, 20}) {
          const GroupedCase c{quant, dtype, 7, 2 * intermediate, cols, n, 3, /*gathered=*/true};
          SCOPED_TRACE(str_cat(c.name(), activation == GateActivation::kSilu ? " silu" : " gelu_tanh"));
          std::mt19937 rng(unsigned(int(quant) * 13 + n));
          const Experts experts = make_experts(c, rng);
          const std::vector<int32_t> expert_of = choices_of(c, rng);
          const int choices = n * c.k, slots = expert_slots(choices, c.experts);
          auto plan_device = on_device(expert_plan_reference(expert_of, c.k, c.experts, 0));
          const ExpertRowsPlan plan = expert_plan_at(plan_device.data(), choices, c.experts);
          std::vector<float> unused;
          auto x = on_device(random_inputs(size_t(n) * size_t(cols), dtype, rng, unused));
          // The two kernels: the products [choices, 2·intermediate], then the activation.
          auto products = on_device(std::vector<float>(size_t(choices) * size_t(c.rows), 0.0f));
          SLIMKV_ASSERT_OK(grouped_expert_gemv(x.data(), plan.row_of_place, dtype, experts.matrices, plan, slots,
                                               products.data(), c.rows));
          auto want = on_device(std::vector<uint16_t>(size_t(choices) * intermediate, 0));
          SLIMKV_ASSERT_OK(gated_activation(products.data(), choices, intermediate, activation, want.data(), dtype));
          // The one kernel, into guarded rows.
          auto got = on_device(std::vector<uint16_t>(size_t(choices) * intermediate + 5, 0xfbff));
          SLIMKV_ASSERT_OK(grouped_expert_gated_gemv(x.data(), plan.row_of_place, dtype, experts.matrices, activation,
                                                     plan, slots, got.data()));
          const std::vector<uint16_t> want_bits = on_host(want), got_bits = on_host(got);
          for (size_t i = 0; i < want_bits.size(); ++i) {
            ASSERT_EQ(got_bits[i], want_bits[i]) << "place " << i / intermediate << ", column " << i % intermediate;
          }
          for (size_t i = want_bits.size(); i < got_bits.size(); ++i) ASSERT_EQ(got_bits[i], 0xfbff) << "guard " << i;
        }
      }
    }
  }
}

// W_down with the weighted sum made by the last CTA of each block of columns: the same bits as the
// grouped product followed by add_weighted_rows (held to its loop by MoeKernels.WeightedRowsSumAsTheLoop),
// overwriting and accumulating, a row of no experts (NaN), three launches on the same counts (each
// launch leaves them 0); 37 output columns (a block cut short).
TEST_F(MoeGroupedGemv, SumEqualsTheProductThenTheWeightedRows) {
  for (BlockQuant quant : {BlockQuant::kQ8_0, BlockQuant::kQ4_K, BlockQuant::kNone}) {
    const int cols = quant == BlockQuant::kNone ? 48 : 256;
    for (int n : {1, 20}) {
      const GroupedCase c{quant, DType::kF16, 7, 37, cols, n, 3, /*gathered=*/false};
      SCOPED_TRACE(c.name());
      std::mt19937 rng(unsigned(int(quant) * 17 + n));
      const Experts experts = make_experts(c, rng);
      std::vector<int32_t> expert_of = choices_of(c, rng);
      if (n > 5) std::fill(expert_of.begin() + 5 * c.k, expert_of.begin() + 6 * c.k, c.experts);  // row 5: no expert
      const int choices = n * c.k, slots = expert_slots(choices, c.experts);
      auto plan_device = on_device(expert_plan_reference(expert_of, c.k, c.experts, 0));
      const ExpertRowsPlan plan = expert_plan_at(plan_device.data(), choices, c.experts);
      std::vector<float> unused;
      auto x = on_device(random_inputs(size_t(choices) * size_t(cols), c.dtype, rng, unused));
      std::vector<float> weight(static_cast<size_t>(choices)), y0(size_t(n) * size_t(c.rows));
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      for (float& v : weight) v = uniform(rng);
      for (float& v : y0) v = uniform(rng);
      auto weight_device = on_device(weight);
      auto counts = on_device(std::vector<uint32_t>(size_t(grouped_sum_counters(c.rows)), 0));
      for (const bool accumulate : {false, true, true}) {
        SCOPED_TRACE(str_cat("accumulate ", accumulate));
        // The two kernels.
        auto products = on_device(std::vector<float>(size_t(choices) * size_t(c.rows), 0.0f));
        SLIMKV_ASSERT_OK(grouped_expert_gemv(x.data(), nullptr, c.dtype, experts.matrices, plan, slots, products.data(),
                                             c.rows));
        auto want = on_device(y0);
        SLIMKV_ASSERT_OK(add_weighted_rows(products.data(), plan.place_of_choice, weight_device.data(), n, c.k, c.rows,
                                           want.data(), accumulate));
        // The one kernel.
        auto scratch = on_device(std::vector<float>(size_t(choices) * size_t(c.rows), 0.0f));
        auto got = on_device(y0);
        const WeightedRowSum sum{got.data(), accumulate, weight_device.data(), n, c.k, counts.data()};
        SLIMKV_ASSERT_OK(grouped_expert_gemv(x.data(), nullptr, c.dtype, experts.matrices, plan, slots, scratch.data(),
                                             c.rows, sum));
        const std::vector<float> want_values = on_host(want), got_values = on_host(got);
        for (size_t i = 0; i < want_values.size(); ++i) {
          if (std::isnan(want_values[i])) {
            ASSERT_TRUE(std::isnan(got_values[i])) << "row " << i / size_t(c.rows) << ", column " << i % size_t(c.rows);
            continue;
          }
          ASSERT_EQ(got_values[i], want_values[i]) << "row " << i / size_t(c.rows) << ", column " << i % size_t(c.rows);
        }
        for (uint32_t count : on_host(counts)) ASSERT_EQ(count, 0u) << "a count left for the next launch";
      }
    }
  }
}

// Plain rows the 16-byte loads cannot read, and inputs of another dtype than plain weights, are refused.
TEST_F(MoeGroupedGemv, ShapesItCannotHoldAreRefused) {
  ExpertMatrices w;
  w.first.dtype = DType::kF16;
  w.first.rows = 4;
  w.first.cols = 20;
  w.count = 2;
  w.stride_bytes = 256;
  const Status odd = check_grouped_expert_shape(w);
  ASSERT_FALSE(odd.is_ok());
  EXPECT_NE(odd.message().find("[4, 20]"), std::string::npos) << odd.message();
  w.first.cols = 24;
  const Status mixed = grouped_expert_gemv(nullptr, nullptr, DType::kBF16, w, ExpertRowsPlan{}, 1, nullptr, 4);
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.message().find("BF16 with weights in F16"), std::string::npos) << mixed.message();
}

}  // namespace
}  // namespace slimkv::cuda
