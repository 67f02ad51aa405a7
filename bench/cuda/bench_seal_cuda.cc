// Writing a step's K/V and sealing the blocks it fills on the GPU, side by side in one run:
//   separate: write_kv_slots into the FP16 window, then QuantizedBlockSealer::seal reading it back
//             (two launches);
//   fused:    QuantizedBlockSealer::append_and_seal (one launch; a sealed block's step rows are
//             quantized from the step's input, the cache's append);
// plus their bytes checked equal. Per layer, one sequence per batch entry, each step block-aligned.
//
//   bench_seal_cuda --batches 1,8 --tokens 64,512 --bits 2,4
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "kv/cuda/kv_slots.h"
#include "kv/cuda/paged_kv_cache.h"
#include "kv/cuda/quantized_kv_pool.h"
#include "backend/cuda/random_fill.h"
#include "bench_errors.h"
#include "gpu_timing.h"

namespace slimkv::cuda {
namespace {

struct Options {
  std::vector<int> batches = {1, 8};
  std::vector<int> tokens = {64, 512};  // new tokens per sequence in the step
  std::vector<int> bits = {2, 4};
  int kv_heads = 8, head_dim = 128;
  int repetitions = 7;
};

struct Measurement {
  double separate_ms, fused_ms;
  bool same_bytes;
};

Expected<Measurement> measure(const Options& o, int batch, int tokens, int bits) {
  const int blocks_per_sequence = tokens / kCudaBlockTokens, n = batch * tokens;
  const CudaKvShape shape{1, o.kv_heads, o.head_dim, batch * blocks_per_sequence, batch, blocks_per_sequence, n};
  SLIMKV_ASSIGN_OR_RETURN(auto window, CudaPagedKvCache::create(shape));
  std::vector<int> ids, counts(size_t(batch), tokens);
  for (int b = 0; b < batch; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(int id, window->sequences().add_sequence());
    ids.push_back(id);
  }
  SLIMKV_RETURN_IF_ERROR(window->begin_step(ids, counts));
  QuantizationConfig config;
  config.k_bits = config.v_bits = bits;
  SLIMKV_ASSIGN_OR_RETURN(auto sealer, QuantizedBlockSealer::create(config, true, 7, o.kv_heads, o.head_dim));
  std::vector<int> list, block_rows;  // every block wholly the step's
  for (int b = 0; b < batch; ++b) {
    for (int j = 0; j < blocks_per_sequence; ++j) {
      list.insert(list.end(), {window->sequences().blocks(ids[size_t(b)])[size_t(j)], int(list.size() / 3), j});
      block_rows.insert(block_rows.end(), {0, b * tokens + j * kCudaBlockTokens});
    }
  }
  const int seals = int(list.size() / 3);
  SLIMKV_ASSIGN_OR_RETURN(auto device_list, DeviceArray<int>::allocate(list.size(), "seal list"));
  SLIMKV_RETURN_IF_ERROR(device_list.upload(list.data(), list.size()));
  SLIMKV_ASSIGN_OR_RETURN(auto device_rows, DeviceArray<int>::allocate(block_rows.size(), "block rows"));
  SLIMKV_RETURN_IF_ERROR(device_rows.upload(block_rows.data(), block_rows.size()));
  const size_t row_halves = size_t(n) * o.kv_heads * o.head_dim, sealed_bytes = size_t(seals) * o.kv_heads * sealer.layout().block_bytes;
  SLIMKV_ASSIGN_OR_RETURN(auto k, DeviceArray<uint16_t>::allocate(row_halves, "k"));
  SLIMKV_ASSIGN_OR_RETURN(auto v, DeviceArray<uint16_t>::allocate(row_halves, "v"));
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(k.data(), row_halves, 1, 2.0f));
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(v.data(), row_halves, 2, 2.0f));
  SLIMKV_ASSIGN_OR_RETURN(auto separate_blocks, DeviceArray<uint8_t>::allocate(sealed_bytes, "sealed"));
  SLIMKV_ASSIGN_OR_RETURN(auto fused_blocks, DeviceArray<uint8_t>::allocate(sealed_bytes, "sealed"));
  const PagedKvView view = window->view(0);
  const QuantizedBlockSealer::StepRows rows{k.data(), v.data(), window->step_slots(), n, device_rows.data()};
  Measurement m{};
  SLIMKV_ASSIGN_OR_RETURN(m.separate_ms, median_launch_ms([&] {
    SLIMKV_RETURN_IF_ERROR(window->append(0, k.data(), v.data()));
    return sealer.seal(0, view, device_list.data(), seals, separate_blocks.data());
  }, o.repetitions, 10));
  SLIMKV_ASSIGN_OR_RETURN(m.fused_ms, median_launch_ms([&] {
    return sealer.append_and_seal(0, view, rows, device_list.data(), seals, fused_blocks.data());
  }, o.repetitions, 10));
  std::vector<uint8_t> a(sealed_bytes), b(sealed_bytes);
  SLIMKV_RETURN_IF_ERROR(separate_blocks.download(a.data(), a.size()));
  SLIMKV_RETURN_IF_ERROR(fused_blocks.download(b.data(), b.size()));
  m.same_bytes = a == b;
  return m;
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"slimkv: a step's KV write and sealing on the GPU, separate launches vs fused"};
  app.add_option("--batches", o.batches)->delimiter(',');
  app.add_option("--tokens", o.tokens, "new tokens per sequence (a multiple of 64)")->delimiter(',');
  app.add_option("--bits", o.bits)->delimiter(',');
  app.add_option("--kv-heads", o.kv_heads)->capture_default_str();
  app.add_option("--head-dim", o.head_dim)->capture_default_str();
  app.add_option("--repetitions", o.repetitions)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (failed(device_usable())) return 1;
  std::printf("write a step's KV and seal the blocks it fills, one layer: %d kv heads, d %d (µs per layer)\n", o.kv_heads,
              o.head_dim);
  std::printf("%5s %6s %6s %7s | %10s %10s %8s | %s\n", "bits", "batch", "tokens", "blocks", "separate", "fused", "speedup",
              "same bytes");
  for (int bits : o.bits) {
    for (int batch : o.batches) {
      for (int tokens : o.tokens) {
        if (tokens <= 0 || tokens % kCudaBlockTokens != 0) {
          std::fprintf(stderr, "error: --tokens %d is not a positive multiple of %d\n", tokens, kCudaBlockTokens);
          return 1;
        }
        auto m = measure(o, batch, tokens, bits);
        if (failed(m.status())) return 1;
        std::printf("%5d %6d %6d %7d | %10.2f %10.2f %7.2fx | %s\n", bits, batch, tokens, batch * tokens / kCudaBlockTokens,
                    m->separate_ms * 1e3, m->fused_ms * 1e3, m->separate_ms / m->fused_ms, m->same_bytes ? "yes" : "NO");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) { return slimkv::cuda::run(argc, argv); }
