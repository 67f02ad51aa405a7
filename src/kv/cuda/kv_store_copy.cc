#include "kv/cuda/kv_store_copy.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/device_memory.h"
#include "kv/store.h"
#include "util/half.h"

namespace slimkv::cuda {

Status download_page(const PagedKvView& view, int block, std::vector<uint16_t>& k, std::vector<uint16_t>& v) {
  const size_t page = size_t(view.num_kv_heads) * kCudaBlockTokens * size_t(view.head_dim);
  k.resize(page);
  v.resize(page);
  SLIMKV_RETURN_IF_ERROR(copy_to_host(k.data(), view.k + size_t(block) * page, page * 2));
  return copy_to_host(v.data(), view.v + size_t(block) * page, page * 2);
}

void restore_open_tokens_from_page(KvStore& into, int layer, const std::vector<uint16_t>& k,
                                   const std::vector<uint16_t>& v, int n) {
  const KvShape& shape = into.shape();
  const size_t head_page = size_t(kCudaBlockTokens) * size_t(shape.k_dim);
  std::vector<float> k_rows(size_t(n) * size_t(shape.k_dim)), v_rows(k_rows.size());
  for (int g = 0; g < shape.num_kv_heads; ++g) {
    for (size_t i = 0; i < k_rows.size(); ++i) {
      k_rows[i] = fp16_to_float(k[size_t(g) * head_page + i]);
      v_rows[i] = fp16_to_float(v[size_t(g) * head_page + i]);
    }
    into.restore_open_tokens(layer, g, k_rows.data(), v_rows.data(), n);
  }
}

Status restore_open_page(const PagedKvView& view, int block, int open, KvStore& into, int layer) {
  std::vector<uint16_t> k, v;
  if (open > 0) SLIMKV_RETURN_IF_ERROR(download_page(view, block, k, v));
  restore_open_tokens_from_page(into, layer, k, v, open);
  return Status::ok();
}

void store_rows(const KvStore& from, int layer, int first, int n, std::vector<uint16_t>& k, std::vector<uint16_t>& v) {
  const KvShape& shape = from.shape();
  const int heads = shape.num_kv_heads, d = shape.k_dim, block_tokens = from.block_tokens();
  const int sealed_tokens = from.num_sealed_blocks(layer) * block_tokens;
  k.resize(size_t(n) * size_t(heads) * size_t(d));
  v.resize(k.size());
  std::vector<float> open_k, open_v;
  for (int g = 0; g < heads; ++g) {
    const int open = from.num_tokens(layer) - sealed_tokens;
    if (first + n > sealed_tokens && open > 0) {
      open_k.resize(size_t(open) * size_t(d));
      open_v.resize(open_k.size());
      from.widen_open(layer, g, open, open_k.data(), open_v.data());
    }
    for (int t = first; t < first + n; ++t) {
      uint16_t* k_row = k.data() + (size_t(t - first) * size_t(heads) + size_t(g)) * size_t(d);
      uint16_t* v_row = v.data() + (size_t(t - first) * size_t(heads) + size_t(g)) * size_t(d);
      if (t < sealed_tokens) {
        // A dense FP16 block: K [block_tokens, d] then V [block_tokens, d] (kv/codec/dense.h).
        const auto* block = reinterpret_cast<const uint16_t*>(from.sealed_block(layer, g, t / block_tokens));
        const size_t row = size_t(t % block_tokens) * size_t(d);
        std::memcpy(k_row, block + row, size_t(d) * 2);
        std::memcpy(v_row, block + size_t(block_tokens) * size_t(d) + row, size_t(d) * 2);
      } else {
        for (int i = 0; i < d; ++i) {
          k_row[i] = float_to_fp16(open_k[size_t(t - sealed_tokens) * size_t(d) + size_t(i)]);
          v_row[i] = float_to_fp16(open_v[size_t(t - sealed_tokens) * size_t(d) + size_t(i)]);
        }
      }
    }
  }
}

Status append_store_rows(const KvStore& from, int first, int tokens, int step_tokens,
                         const std::function<Status(int n)>& begin,
                         const std::function<Status(int layer, const uint16_t* k, const uint16_t* v)>& append) {
  if (tokens <= 0) return Status::ok();
  const KvShape& shape = from.shape();
  const size_t row = size_t(shape.num_kv_heads) * size_t(shape.k_dim);
  const int chunk = std::min(tokens, step_tokens);
  SLIMKV_ASSIGN_OR_RETURN(auto k_device, DeviceArray<uint16_t>::allocate(size_t(chunk) * row, "imported keys"));
  SLIMKV_ASSIGN_OR_RETURN(auto v_device, DeviceArray<uint16_t>::allocate(size_t(chunk) * row, "imported values"));
  std::vector<uint16_t> k, v;
  for (int done = 0; done < tokens; done += chunk) {
    const int n = std::min(chunk, tokens - done);
    SLIMKV_RETURN_IF_ERROR(begin(n));
    for (int l = 0; l < shape.num_layers; ++l) {
      store_rows(from, l, first + done, n, k, v);
      SLIMKV_RETURN_IF_ERROR(k_device.upload(k.data(), k.size()));
      SLIMKV_RETURN_IF_ERROR(v_device.upload(v.data(), v.size()));
      SLIMKV_RETURN_IF_ERROR(append(l, k_device.data(), v_device.data()));
    }
  }
  return Status::ok();
}

}  // namespace slimkv::cuda
