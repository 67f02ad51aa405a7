// The host tiers on the GPU (`@offload`, `@kvpr`; host_kv_tier.h): every token's K/V (and, kvpr, X) in
// pinned host memory, staged to the GPU a unit (layer × micro-batch) at a time; kvpr recomputes the
// K/V of each sequence's first tokens from X through the model's KvProjection while the rest streams in.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kv/cuda/gpu_kv_cache.h"
#include "kv/cuda/host_kv_tier.h"
#include "kv/cuda/kv_store_copy.h"
#include "kv/store.h"

namespace slimkv::cuda {
namespace {

class GpuHostTierKv final : public GpuKvCache {
 public:
  GpuHostTierKv(const GpuKvShape& shape, const KvTierOptions& options, std::unique_ptr<CudaHostKvTier> tier,
                std::unique_ptr<CudaPagedAttention> attention, KvProjection* projection)
      : shape_(shape), options_(options), tier_(std::move(tier)), projection_(projection) {
    attention_.push_back(std::move(attention));
    report_.cost = kvpr_cost_model(shape.hidden, shape.kv_dim(), shape.x_dtype, tier_->kv_bytes_per_token(),
                                   options.link_bytes_per_s, options.gemm_flops_per_s);
    report_.x_staging_bytes = tier_->staging_x_bytes();
  }

  const SequenceBlocks& sequences() const override { return tier_->sequences(); }
  Expected<int> add_sequence() override { return tier_->sequences().add_sequence(); }
  void remove_sequence(int sequence) override { tier_->sequences().remove_sequence(sequence); }
  size_t device_bytes() const override { return tier_->staging_bytes(); }
  size_t host_bytes() const override { return tier_->host_bytes(); }
  size_t bytes_per_block() const override { return tier_->host_bytes() / size_t(std::max(1, sequences().num_blocks())); }
  KvprReport kvpr() const override { return report_; }
  bool keeps_layer_input() const override { return true; }  // store_x keeps it for kvpr, ignores it otherwise

  Status check_step(const PagedAttentionBatch& batch) const override {
    SLIMKV_RETURN_IF_ERROR(check_blocks_for_step(sequences(), batch, "host"));
    return tier_->plan_micro_batches(batch.sequence_ids, batch.query_counts).status();
  }

  Status begin_step(const PagedAttentionBatch& batch) override {
    // KVPR's split: the cost model's (Eq. 10 over the step's held tokens, which it treats as one batch),
    // or the one asked for.
    double& fraction = report_.last_recompute_fraction;
    fraction = 0;
    if (options_.recompute) {
      if (options_.split >= 0) {
        fraction = options_.split;
      } else {
        long held_tokens = 0;
        for (size_t i = 0; i < batch.kv_lens.size(); ++i) held_tokens += batch.kv_lens[i] - batch.query_counts[i];
        if (held_tokens > 0) fraction = double(report_.cost.best_split(held_tokens)) / double(held_tokens);
      }
    }
    SLIMKV_RETURN_IF_ERROR(tier_->begin_step(batch.sequence_ids, batch.query_counts, fraction));
    // One attention plan per micro-batch; its sequences are named by step index (the tier's tables).
    const std::vector<MicroBatch>& micro_batches = tier_->micro_batches();
    while (attention_.size() < micro_batches.size()) {
      SLIMKV_ASSIGN_OR_RETURN(auto attention, CudaPagedAttention::create(attention_[0]->shape()));
      attention_.push_back(std::move(attention));
    }
    for (size_t m = 0; m < micro_batches.size(); ++m) {
      const MicroBatch& mb = micro_batches[m];
      PagedAttentionBatch part;
      for (int i = mb.first_sequence; i < mb.first_sequence + mb.num_sequences; ++i) {
        part.sequence_ids.push_back(i);
        part.kv_lens.push_back(batch.kv_lens[size_t(i)]);
        part.query_counts.push_back(batch.query_counts[size_t(i)]);
      }
      SLIMKV_RETURN_IF_ERROR(attention_[m]->plan(part));
    }
    return Status::ok();
  }

  Status keep_layer_input(int layer, const void* x) override {
    return tier_->store_x(layer, x);
  }

  // The layer's units, one per micro-batch: the next unit's copies go out first, so the link stays busy
  // while this one recomputes and attends.
  Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                uint16_t* out) override {
    const std::vector<MicroBatch>& micro_batches = tier_->micro_batches();
    const size_t q_width = size_t(shape_.num_heads) * size_t(shape_.head_dim);
    for (size_t m = 0; m < micro_batches.size(); ++m) {
      const int unit = layer * int(micro_batches.size()) + int(m);
      if (unit + 1 < tier_->num_units()) SLIMKV_RETURN_IF_ERROR(tier_->prefetch(unit + 1));
      SLIMKV_RETURN_IF_ERROR(recompute(layer, unit));
      SLIMKV_RETURN_IF_ERROR(tier_->append(unit, k, v));
      const size_t first = size_t(micro_batches[m].first_query) * q_width;
      if (tier_->attends_sealed()) {
        SLIMKV_RETURN_IF_ERROR(
            attention_[m]->run_quantized(tier_->view(unit), tier_->sealed_view(unit), q + first, scale, out + first));
      } else {
        SLIMKV_RETURN_IF_ERROR(attention_[m]->run(tier_->view(unit), q + first, scale, out + first));
      }
      SLIMKV_RETURN_IF_ERROR(tier_->release(unit));
    }
    return Status::ok();
  }

  Status begin_fill(int sequence, int tokens) override {
    return tier_->begin_step({sequence}, {tokens}, 0, /*stage=*/false);
  }
  Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* x) override {
    SLIMKV_RETURN_IF_ERROR(tier_->store_x(layer, x));
    return tier_->store_kv(layer, k, v);
  }

  // From the pinned host pool (the GPU's writes through its mapping done first): sealed blocks as the
  // host keeps them (quantized codecs), or FP16 K/V as `dense:dtype=f16` blocks; the open block's FP16.
  Status export_sequence(int sequence, KvStore& into) const override {
    SLIMKV_RETURN_IF_ERROR(device_synchronize("exporting a sequence from the host KV tier"));
    const int tokens = sequences().num_tokens(sequence), full = tokens / kCudaBlockTokens;
    const std::vector<int>& blocks = sequences().blocks(sequence);
    const size_t head_page = size_t(kCudaBlockTokens) * size_t(shape_.head_dim);
    const size_t k_halves = size_t(shape_.num_kv_heads) * head_page;  // K's half of a K|V block
    const auto& sealer = tier_->sealer();
    std::vector<uint16_t> dense_block(2 * head_page), k, v;
    into.clear();
    for (int l = 0; l < shape_.num_layers; ++l) {
      for (int g = 0; g < shape_.num_kv_heads; ++g) {
        for (int b = 0; b < full; ++b) {
          if (sealer) {
            into.restore_sealed_block(l, g, tier_->host_sealed_block(l, blocks[size_t(b)]) + size_t(g) * sealer->layout().block_bytes);
            continue;
          }
          const uint16_t* kv = tier_->host_kv_block(l, blocks[size_t(b)]);
          std::memcpy(dense_block.data(), kv + size_t(g) * head_page, head_page * 2);
          std::memcpy(dense_block.data() + head_page, kv + k_halves + size_t(g) * head_page, head_page * 2);
          into.restore_sealed_block(l, g, reinterpret_cast<const uint8_t*>(dense_block.data()));
        }
      }
      const int open = tokens - full * kCudaBlockTokens;
      if (open > 0) {
        const uint16_t* kv = tier_->host_kv_block(l, blocks[size_t(full)]);
        k.assign(kv, kv + k_halves);
        v.assign(kv + k_halves, kv + 2 * k_halves);
      }
      restore_open_tokens_from_page(into, l, k, v, open);
    }
    return Status::ok();
  }

  // Into the pinned host pool: sealed blocks as they come (quantized codecs; their FP16 is never read
  // again: steps move a sealed block's bytes), or dense blocks' FP16; the open tokens in FP16. Not into
  // kvpr, which recomputes K/V from the attention inputs X that a transfer does not carry.
  Status import_sequence(int sequence, const KvStore& from) override {
    if (options_.recompute) {
      return error("importing KV into the kvpr tier: it recomputes K/V from each token's attention inputs X, which ",
                   "a KV transfer does not carry (import into @offload or a resident cache)");
    }
    const int tokens = from.num_tokens(0), full = tokens / kCudaBlockTokens;
    const int needed = sequences().blocks_to_grow(sequence, tokens);
    if (needed > sequences().free_blocks()) {
      return error("the host KV pool has no room for the imported sequence: ", needed, " blocks of ", kCudaBlockTokens,
                   " tokens needed, ", sequences().free_blocks(), " free");
    }
    SLIMKV_RETURN_IF_ERROR(device_synchronize("importing a sequence into the host KV tier"));
    SLIMKV_RETURN_IF_ERROR(tier_->sequences().grow(sequence, tokens).with_context("importing KV into the host tier"));
    const std::vector<int>& blocks = sequences().blocks(sequence);
    const size_t head_page = size_t(kCudaBlockTokens) * size_t(shape_.head_dim);
    const size_t k_halves = size_t(shape_.num_kv_heads) * head_page;
    const auto& sealer = tier_->sealer();
    std::vector<uint16_t> k, v;
    for (int l = 0; l < shape_.num_layers; ++l) {
      for (int g = 0; g < shape_.num_kv_heads; ++g) {
        for (int b = 0; b < full; ++b) {
          if (sealer) {
            std::memcpy(tier_->host_sealed_block(l, blocks[size_t(b)]) + size_t(g) * sealer->layout().block_bytes,
                        from.sealed_block(l, g, b), sealer->layout().block_bytes);
            continue;
          }
          const auto* block = reinterpret_cast<const uint16_t*>(from.sealed_block(l, g, b));
          uint16_t* kv = tier_->host_kv_block(l, blocks[size_t(b)]);
          std::memcpy(kv + size_t(g) * head_page, block, head_page * 2);
          std::memcpy(kv + k_halves + size_t(g) * head_page, block + head_page, head_page * 2);
        }
      }
      const int open = tokens - full * kCudaBlockTokens;
      if (open == 0) continue;
      store_rows(from, l, full * kCudaBlockTokens, open, k, v);  // [open, heads, head_dim]
      uint16_t* kv = tier_->host_kv_block(l, blocks[size_t(full)]);
      for (int t = 0; t < open; ++t) {
        for (int g = 0; g < shape_.num_kv_heads; ++g) {
          const size_t row = (size_t(t) * size_t(shape_.num_kv_heads) + size_t(g)) * size_t(shape_.head_dim);
          const size_t at = size_t(g) * head_page + size_t(t) * size_t(shape_.head_dim);
          std::memcpy(kv + at, k.data() + row, size_t(shape_.head_dim) * 2);
          std::memcpy(kv + k_halves + at, v.data() + row, size_t(shape_.head_dim) * 2);
        }
      }
    }
    return Status::ok();
  }

 private:
  // The unit's recomputed K/V (KVPR), from its X rows, into its staging buffer.
  Status recompute(int layer, int unit) {
    SLIMKV_ASSIGN_OR_RETURN(RecomputeRows rows, tier_->recompute_rows(unit));
    if (rows.rows > 0 && projection_ == nullptr) return error("KVPR: the tier recomputes but has no projection");
    const size_t x_row_bytes = size_t(shape_.hidden) * dtype_size_bytes(shape_.x_dtype);
    for (int first = 0; first < rows.rows; first += projection_->max_rows()) {
      const int n = std::min(projection_->max_rows(), rows.rows - first);
      const uint16_t *k = nullptr, *v = nullptr;
      SLIMKV_RETURN_IF_ERROR(projection_->project_kv(layer, static_cast<const uint8_t*>(rows.x) + size_t(first) * x_row_bytes,
                                                     n, rows.positions + first, &k, &v));
      SLIMKV_RETURN_IF_ERROR(tier_->write_recomputed(unit, k, v, rows.slots + first, n));
    }
    return tier_->seal_recomputed(unit);
  }

  GpuKvShape shape_;
  KvTierOptions options_;
  std::unique_ptr<CudaHostKvTier> tier_;
  KvProjection* projection_;
  KvprReport report_;
  // Attention plans: one per micro-batch of a step.
  std::vector<std::unique_ptr<CudaPagedAttention>> attention_;
};

}  // namespace

Expected<std::unique_ptr<GpuKvCache>> make_gpu_host_tier_kv(const GpuKvShape& s, const GpuKvOptions& kv_options,
                                                            KvProjection* projection) {
  const KvTierOptions& options = *kv_options.tier;
  const size_t gpu_kv_bytes = kv_options.kv_cache_bytes;
  const int blocks_per_sequence = s.blocks_per_sequence();
  std::optional<QuantizedBlockSealer> sealer;
  if (const auto& q = kv_options.quantized) {
    SLIMKV_ASSIGN_OR_RETURN(sealer, QuantizedBlockSealer::create(q->config, q->hack, q->seed, s.num_kv_heads, s.head_dim));
  }
  const size_t sealed_block_bytes = sealer ? size_t(s.num_kv_heads) * sealer->layout().block_bytes : 0;
  const size_t kv_block_bytes = 2 * size_t(s.num_kv_heads) * kCudaBlockTokens * size_t(s.head_dim) * 2 + sealed_block_bytes;
  const size_t x_block_bytes = size_t(kCudaBlockTokens) * size_t(s.hidden) * dtype_size_bytes(s.x_dtype);
  const size_t per_token_all_layers =
      size_t(s.num_layers) * (kv_block_bytes + (options.recompute ? x_block_bytes : 0)) / kCudaBlockTokens;
  const size_t host_blocks = options.host_bytes > 0 ? options.host_bytes / (per_token_all_layers * kCudaBlockTokens)
                                                    : size_t(s.max_sequences) * size_t(blocks_per_sequence);
  // Staging: two buffers of K|V (and X rows for kvpr) of one layer.
  const size_t staging_block_bytes = 2 * (kv_block_bytes + (options.recompute ? x_block_bytes : 0));
  size_t staging_blocks = size_t(s.max_sequences) * size_t(blocks_per_sequence);
  if (gpu_kv_bytes > 0) {
    staging_blocks = gpu_kv_bytes / (2 * kv_block_bytes);
  } else {
    SLIMKV_ASSIGN_OR_RETURN(size_t free_bytes, device_free_memory());
    staging_blocks = std::min(staging_blocks, free_bytes / 10 * 8 / staging_block_bytes);
  }
  if (host_blocks == 0 || staging_blocks == 0) {
    return error("CUDA model: the KV tier has no room (host pool ", options.host_bytes, " bytes, GPU KV budget ",
                 gpu_kv_bytes, " bytes: a block of 64 tokens takes ", per_token_all_layers * kCudaBlockTokens,
                 " bytes of host memory, ", 2 * kv_block_bytes, " of GPU memory)");
  }
  const HostKvTierShape shape{s.num_layers, s.num_kv_heads, s.head_dim, s.hidden, s.x_dtype,
                              s.max_sequences, blocks_per_sequence, s.max_step_tokens,
                              int(std::min<size_t>(host_blocks, 1u << 30)), int(std::min<size_t>(staging_blocks, 1u << 30)),
                              options.recompute, options.micro_batches};
  SLIMKV_ASSIGN_OR_RETURN(auto tier, CudaHostKvTier::create(shape, sealer));
  SLIMKV_ASSIGN_OR_RETURN(auto attention, CudaPagedAttention::create({s.num_heads, s.num_kv_heads, s.head_dim,
                                                                      s.max_sequences, s.max_step_tokens}));
  return std::unique_ptr<GpuKvCache>(new GpuHostTierKv(s, options, std::move(tier), std::move(attention), projection));
}

}  // namespace slimkv::cuda
