// `pq:...` on the GPU (issue 25; PQCache, ../shared/papers/002): FP16 pages as `dense` keeps them — in
// GPU memory, or with `@offload` in pinned host memory mapped into the GPU — and the PQ index on the GPU
// (pq_gpu_index.h). A decode step selects per (sequence, KV head) the CPU selector's way (pq_select.h:
// init tokens, the top-k middle tokens by ADC score re-ranked exactly, the local window), gathers only
// the selected tokens' K/V into a compact GPU buffer (from host memory: only they cross PCIe) and runs
// the paged attention kernel over it. With @offload and `rows=on` each full block's K/V is also copied
// token-major into pinned host memory as it fills (pq_fp16_row_copies: a token's key and value side by
// side, a head's tokens back to back), where the re-rank and the gather read them instead of the
// page-strided pages (off by default: no faster on an H100, twice the host memory). Sequences with a
// prefill chunk in the step attend to every token (PQCache selects only while decoding); decode rows beside
// them still select, so that a sequence's tokens do not depend on the server's batch. With @offload, a GPU cache of selected tokens
// (pq_token_cache.h, `cache` tokens per layer and KV head, `policy` lru or lfu; cache=0: none) serves
// the tokens that recent steps selected. A sequence moves out and in (preemption, disaggregation) as
// dense FP16 blocks through a host store; the PQ index is rebuilt from the imported keys.
//
// With a quantizing codec (`pq:...+hack:bits=B`, `+quant`): the store is the quantized cache's
// (quantized_kv_cache.h: 64-token blocks sealed in the codec's bytes, the open block FP16), its sealed
// pool in pinned host memory with @offload (the FP16 window stays on the GPU). The index clusters the
// keys as they arrive, before sealing (the CPU store hands its selector the block's keys it seals, not
// them decoded); the re-rank scores the candidates' keys dequantized from their blocks and the gather
// writes the selected tokens dequantized into the compact FP16 buffer, reading only their codes and
// scales (pq_select.h). With @offload (unless `rows=off`), each sealed key (HACK's K layout) and value is also copied
// token-major into pinned host memory as its block seals (PqTokenRows: a 2-bit key in two sectors, not
// one per 4 dims; a value in one or two, not six), where the re-rank and the gather read them, and with
// HACK's V layout each sealed block's per-column V mins and scales into GPU memory (PqValueScales: 512
// bytes a selected token's value no longer reads over PCIe; `rows=off`: none). Steps without selection,
// and prefill chunks, attend as the quantized cache does (run_quantized). A sequence moves out and in as hack's do
// (device pages: its sealed blocks as they are, then the open tokens); the importing cache builds the
// index from the blocks' keys dequantized, as the CPU store does from restored blocks (so its
// selections may differ from the exporter's, whose index saw the keys before sealing).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/pinned_memory.h"
#include "backend/cuda/row_gather.h"
#include "kv/cuda/gpu_kv_cache.h"
#include "kv/cuda/kv_store_copy.h"
#include "kv/cuda/paged_kv_cache.h"
#include "kv/cuda/pq_gpu_index.h"
#include "kv/cuda/pq_select.h"
#include "kv/cuda/pq_token_cache.h"
#include "kv/cuda/quantized_kv_cache.h"
#include "kv/store.h"

namespace slimkv::cuda {
namespace {

class GpuPqKv final : public GpuKvCache {
 public:
  GpuPqKv(const GpuKvShape& shape, const PqKvOptions& options, const std::optional<QuantizedKvOptions>& sealed)
      : shape_(shape), options_(options), sealed_options_(sealed) {}

  // The index and the selection's buffers first; then the pages (or sealed blocks): in host memory
  // (@offload) room for every sequence's full context, else what kv_cache_bytes says, or every full
  // context within 90% of the free GPU memory (the quantized cache's FP16 window taken first).
  Status init(size_t kv_cache_bytes) {
    SLIMKV_ASSIGN_OR_RETURN(index_, CudaPqIndex::create({shape_.num_layers, shape_.num_kv_heads, shape_.head_dim,
                                                         shape_.max_sequences, shape_.context_tokens, shape_.max_step_tokens},
                                                        options_.pq, options_.seed));
    // The most tokens a decode row attends to (topk_selector.h): init + k + the local window and the open
    // block, and the segment not clustered yet; every token while k covers the middle.
    const PqOptions& pq = options_.pq;
    const int context = shape_.context_tokens, k = pq.window.topk_tokens(context);
    max_candidates_ = std::min(context, int(std::ceil(double(k) * pq.rerank)));
    const long bound = long(pq.window.init_tokens) + k + pq.window.local_tokens + pq.segment_tokens + 2 * kCudaBlockTokens;
    selected_blocks_ = int((std::min<long>(context, bound) + kCudaBlockTokens - 1) / kCudaBlockTokens);
    const size_t rows = size_t(shape_.max_sequences), heads = size_t(shape_.num_kv_heads), d = size_t(shape_.head_dim);
    const size_t compact = rows * size_t(selected_blocks_) * heads * kCudaBlockTokens * d;
    SLIMKV_ASSIGN_OR_RETURN(compact_k_, DeviceArray<uint16_t>::allocate(compact, "the selected keys"));
    SLIMKV_ASSIGN_OR_RETURN(compact_v_, DeviceArray<uint16_t>::allocate(compact, "the selected values"));
    std::vector<int> tables(rows * size_t(selected_blocks_));
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = int(i);
    SLIMKV_ASSIGN_OR_RETURN(compact_tables_, DeviceArray<int>::allocate(tables.size(), "the selection's block tables"));
    SLIMKV_RETURN_IF_ERROR(compact_tables_.upload(tables.data(), tables.size()));
    const size_t segments = size_t((context + pq.segment_tokens - 1) / pq.segment_tokens);
    const size_t candidates = size_t(std::max(1, max_candidates_));
    SLIMKV_ASSIGN_OR_RETURN(tables_, DeviceArray<float>::allocate(rows * heads * segments * (size_t(pq.m) << pq.bits), "PQ tables"));
    SLIMKV_ASSIGN_OR_RETURN(scores_, DeviceArray<float>::allocate(rows * heads * size_t(context), "ADC scores"));
    SLIMKV_ASSIGN_OR_RETURN(ranked_, DeviceArray<int>::allocate(rows * heads * candidates, "PQ candidates"));
    SLIMKV_ASSIGN_OR_RETURN(kept_, DeviceArray<int>::allocate(rows * heads * candidates, "re-ranked candidates"));
    SLIMKV_ASSIGN_OR_RETURN(exact_, DeviceArray<float>::allocate(rows * heads * candidates, "exact scores"));
    SLIMKV_ASSIGN_OR_RETURN(candidate_keys_, DeviceArray<uint16_t>::allocate(rows * heads * candidates * d, "candidate keys"));
    SLIMKV_ASSIGN_OR_RETURN(lengths_, DeviceArray<int>::allocate(4 * rows, "selection lengths"));
    SLIMKV_ASSIGN_OR_RETURN(top_k_, DeviceArray<int>::allocate(top_k_scratch_ints(int(rows * heads), context), "top-k scratch"));
    SLIMKV_ASSIGN_OR_RETURN(rows_, DeviceArray<PqSelectRow>::allocate(rows, "selection rows"));
    CudaKvShape kv_shape{shape_.num_layers,    shape_.num_kv_heads,          shape_.head_dim,           0,
                         shape_.max_sequences, shape_.blocks_per_sequence(), shape_.max_step_tokens, options_.offload};
    size_t block_bytes = fp16_block_bytes(), window_bytes = 0;
    if (sealed_options_) {
      SLIMKV_ASSIGN_OR_RETURN(block_bytes, CudaQuantizedKvCache::sealed_block_bytes(kv_shape, sealed_options_->config));
      if (!options_.offload) window_bytes = size_t(CudaQuantizedKvCache::window_blocks(kv_shape)) * fp16_block_bytes();
    }
    size_t num_blocks = size_t(shape_.max_sequences) * size_t(shape_.blocks_per_sequence());
    if (!options_.offload) {
      size_t budget = kv_cache_bytes;
      if (budget == 0) {
        SLIMKV_ASSIGN_OR_RETURN(const size_t free_bytes, device_free_memory());
        budget = std::min(num_blocks * block_bytes + window_bytes, free_bytes / 10 * 9);
      }
      num_blocks = budget > window_bytes ? (budget - window_bytes) / block_bytes : 0;
      if (num_blocks == 0) return error("pq on device 'cuda': no room for a single KV block of ", block_bytes, " bytes");
    }
    kv_shape.num_blocks = int(std::min<size_t>(num_blocks, 1u << 30));
    if (sealed_options_) {
      const QuantizedKvOptions& q = *sealed_options_;
      SLIMKV_ASSIGN_OR_RETURN(sealed_, CudaQuantizedKvCache::create(kv_shape, q.config, q.hack, q.seed));
      if (keeps_rows() && !q.config.k_per_channel) {
        SLIMKV_RETURN_IF_ERROR(allocate_rows(key_rows_, pq_key_row_bytes(shape_.head_dim, q.config.k_bits),
                                             "pq's token-major copy of the sealed keys"));
      }
      if (keeps_rows()) {
        const int v_groups = q.config.v_per_token ? sealed_->layout().v_groups : 0;
        SLIMKV_RETURN_IF_ERROR(allocate_rows(value_rows_, pq_value_row_bytes(shape_.head_dim, q.config.v_bits, v_groups),
                                             "pq's token-major copy of the sealed values"));
      }
      if (keeps_rows() && !q.config.v_per_token) {
        SLIMKV_ASSIGN_OR_RETURN(value_scales_,
                                DeviceArray<uint16_t>::allocate(size_t(shape_.num_layers) * value_scales_layer(),
                                                                "pq's copy of the sealed blocks' V scales"));
      }
    } else {
      SLIMKV_ASSIGN_OR_RETURN(pages_, CudaPagedKvCache::create(kv_shape));
      if (keeps_rows()) {
        SLIMKV_RETURN_IF_ERROR(allocate_rows(fp16_rows_, pq_fp16_row_bytes(shape_.head_dim),
                                             "pq's token-major copy of the FP16 pages"));
      }
    }
    const PagedAttentionShape attention{shape_.num_heads, shape_.num_kv_heads, shape_.head_dim, shape_.max_sequences,
                                        shape_.max_step_tokens};
    SLIMKV_ASSIGN_OR_RETURN(full_attention_, CudaPagedAttention::create(attention));
    if (options_.offload && pq.cache_tokens != 0) {
      const PqTokenCacheShape cache{shape_.num_layers,
                                    shape_.num_kv_heads,
                                    shape_.head_dim,
                                    shape_.max_sequences,
                                    shape_.blocks_per_sequence() * kCudaBlockTokens,
                                    pq.cache_tokens,
                                    selected_blocks_ * kCudaBlockTokens};
      SLIMKV_ASSIGN_OR_RETURN(token_cache_, CudaPqTokenCache::create(
                                                cache, pq.policy == "lfu" ? CachePolicy::kLfu : CachePolicy::kLru));
    }
    SLIMKV_ASSIGN_OR_RETURN(decode_query_offsets_, DeviceArray<long long>::allocate(rows, "the decode rows' query offsets"));
    SLIMKV_ASSIGN_OR_RETURN(decode_queries_, DeviceArray<uint16_t>::allocate(rows * size_t(shape_.num_heads) * d,
                                                                             "the decode rows' queries"));
    return Status::ok();
  }

  const SequenceBlocks& sequences() const override { return sealed_ ? sealed_->sequences() : pages_->sequences(); }
  Expected<int> add_sequence() override {
    SLIMKV_ASSIGN_OR_RETURN(const int sequence, sealed_ ? sealed_->add_sequence() : pages_->sequences().add_sequence());
    SLIMKV_RETURN_IF_ERROR(index_->reset_sequence(sequence));
    if (token_cache_) SLIMKV_RETURN_IF_ERROR(token_cache_->reset_sequence(sequence));
    return sequence;
  }
  void remove_sequence(int sequence) override {
    if (sealed_) return sealed_->remove_sequence(sequence);
    pages_->sequences().remove_sequence(sequence);
  }
  // GPU memory: the pages (unless offloaded; sealed: the quantized cache's, its FP16 window always), the
  // index, the selection's buffer and scratch, the cache of selected tokens.
  size_t device_bytes() const override {
    const size_t pages = pages_ ? size_t(pages_->shape().num_blocks) * bytes_per_block() : 0;
    const size_t store = sealed_ ? sealed_->bytes() : options_.offload ? 0 : pages;
    return store + index_->device_bytes() +
           (token_cache_ ? token_cache_->device_bytes() : 0) +
           compact_k_.bytes() + compact_v_.bytes() + tables_.bytes() + scores_.bytes() + ranked_.bytes() + kept_.bytes() +
           exact_.bytes() + candidate_keys_.bytes() + top_k_.bytes() + decode_queries_.bytes() + value_scales_.bytes();
  }
  size_t host_bytes() const override {
    const size_t pages = pages_ ? size_t(pages_->shape().num_blocks) * bytes_per_block() : 0;
    const size_t rows = key_rows_.pool.bytes() + value_rows_.pool.bytes() + fp16_rows_.pool.bytes();
    const size_t store = sealed_ ? sealed_->host_bytes() : options_.offload ? pages : 0;
    return store + rows + index_->host_bytes();
  }
  size_t bytes_per_block() const override {
    if (sealed_) return size_t(shape_.num_layers) * size_t(shape_.num_kv_heads) * sealed_->layout().block_bytes;
    return fp16_block_bytes();
  }
  // The cache's counts wait for its last update; a hit saved reading the token's K and V from the store
  // (sealed: their codes and scales, about).
  SelectionReport selection() const override {
    SelectionReport report = report_;
    if (!token_cache_ || !select_) return report;
    const size_t hit_saves =
        sealed_ ? dequantized_token_bytes(sealed_->layout(), 1, true, true) : size_t(shape_.head_dim) * 4;
    const Expected<PqCacheCounters> counters = token_cache_->counters();
    if (!counters.has_value()) return report;  // the device failed: the next step reports it
    const size_t row_bytes = size_t(shape_.head_dim) * 2 * 2;  // FP16 K and V: what a hit copies
    report.cache_used_tokens = counters->used_tokens;
    report.cache_hit_tokens = counters->hit_tokens;
    report.cache_filled_bytes = size_t(counters->filled_tokens) * row_bytes;
    report.page_bytes_read -= std::min(report.page_bytes_read, size_t(counters->hit_tokens) * hit_saves);
    return report;
  }

  Status check_step(const PagedAttentionBatch& batch) const override {
    if (sealed_) return sealed_->check_step(batch.sequence_ids, batch.query_counts);
    return check_blocks_for_step(sequences(), batch, options_.offload ? "host" : "GPU");
  }

  // Decode rows (one query) select; the step's other sequences (prefill chunks) attend to every token,
  // so that a sequence's selection does not depend on what shares its step (a server's batch). The
  // step's attention runs in parts, each a run of consecutive sequences of one kind (queries lie
  // sequence by sequence): decode rows over the compact buffer, the others over the pages (or the sealed
  // blocks and the FP16 window, as hack attends).
  Status begin_step(const PagedAttentionBatch& batch) override {
    SLIMKV_RETURN_IF_ERROR(index_->begin_step(batch.sequence_ids, batch.query_counts));
    plan_sealed_copies(batch.sequence_ids, batch.query_counts);
    SLIMKV_RETURN_IF_ERROR(begin_store_step(batch.sequence_ids, batch.query_counts));
    report_ = SelectionReport{};
    plan_rows(batch);
    // Resident pages attended whole need no copy.
    const bool any_ranked = std::any_of(host_rows_.begin(), host_rows_.end(), [](const PqSelectRow& r) { return !r.all; });
    select_ = !host_rows_.empty() && (options_.offload || any_ranked);
    if (!select_) return full_attention_->plan(batch);
    if (token_cache_) SLIMKV_RETURN_IF_ERROR(token_cache_->begin_step());
    const int rows = int(host_rows_.size());
    std::vector<int> lengths(4 * size_t(rows));
    for (int r = 0; r < rows; ++r) {
      const PqSelectRow& row = host_rows_[size_t(r)];
      if (row.selected > selected_blocks_ * kCudaBlockTokens) {
        return error("pq on device 'cuda': sequence ", row.sequence, " attends to ", row.selected,
                     " tokens, more than the selection buffer's ", selected_blocks_ * kCudaBlockTokens);
      }
      const bool ranks = !row.all;
      lengths[size_t(r)] = ranks ? row.middle_end - row.init_end : 0;
      lengths[size_t(rows + r)] = ranks ? row.candidates : 0;
      lengths[size_t(2 * rows + r)] = ranks && row.candidates > row.k ? row.candidates : 0;
      lengths[size_t(3 * rows + r)] = ranks ? row.k : 0;
    }
    SLIMKV_RETURN_IF_ERROR(rows_.upload(host_rows_.data(), host_rows_.size()));
    SLIMKV_RETURN_IF_ERROR(lengths_.upload(lengths.data(), lengths.size()));
    // With a prefill chunk before a decode row, the decode rows' queries are gathered for the selection,
    // which reads them as rows [num_rows, num_heads, head_dim].
    gather_queries_ = false;
    for (int r = 0; r < rows; ++r) gather_queries_ = gather_queries_ || row_query_[size_t(r)] != r;
    if (gather_queries_) {
      std::vector<long long> offsets;
      for (const int query : row_query_) offsets.push_back((long long)(query) * (long long)(query_row_bytes()));
      SLIMKV_RETURN_IF_ERROR(decode_query_offsets_.upload(offsets.data(), offsets.size()));
    }
    return plan_parts(batch);
  }

  Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                uint16_t* out) override {
    SLIMKV_RETURN_IF_ERROR(append_to_store(layer, k, v));
    SLIMKV_RETURN_IF_ERROR(write_sealed_copies(layer));
    SLIMKV_RETURN_IF_ERROR(index_->keep_keys(layer, k));
    if (!select_) return attend_store(*full_attention_, layer, q, scale, out);
    SLIMKV_RETURN_IF_ERROR(index_->finish_layer(layer));
    PqSelectLaunch launch;
    launch.rows = rows_.data();
    launch.num_rows = int(host_rows_.size());
    for (const PqSelectRow& r : host_rows_) {
      if (r.all) {
        launch.max_selected = std::max(launch.max_selected, r.selected);
        continue;
      }
      launch.max_trained_segments = std::max(launch.max_trained_segments, r.trained_segments);
      launch.max_middle = std::max(launch.max_middle, r.middle_end - r.init_end);
      if (r.candidates > r.k) launch.max_candidates = std::max(launch.max_candidates, r.candidates);
      launch.max_selected = std::max(launch.max_selected, r.selected);
    }
    launch.q = q;
    if (gather_queries_) {
      SLIMKV_RETURN_IF_ERROR(gather_rows({reinterpret_cast<const uint8_t*>(q), decode_query_offsets_.data(), launch.num_rows,
                                          int(query_row_bytes()), reinterpret_cast<uint8_t*>(decode_queries_.data())}));
      launch.q = decode_queries_.data();
    }
    launch.num_heads = shape_.num_heads;
    launch.num_kv_heads = shape_.num_kv_heads;
    launch.index = index_->view(layer);
    launch.source = fp16_view(layer);
    if (sealed_) launch.sealed = sealed_->sealed_view(layer);
    launch.copies = copies_of(layer);
    launch.scratch = PqSelectScratch{tables_.data(), scores_.data(), ranked_.data(), exact_.data(), candidate_keys_.data(),
                                     kept_.data(), lengths_.data(), top_k_.data(), shape_.context_tokens, std::max(1, max_candidates_)};
    launch.out_k = compact_k_.data();
    launch.out_v = compact_v_.data();
    launch.out_blocks_per_row = selected_blocks_;
    if (token_cache_) {
      launch.cache = token_cache_->view(layer);
      SLIMKV_RETURN_IF_ERROR(token_cache_->wait_for_update());
    }
    SLIMKV_RETURN_IF_ERROR(pq_select_and_gather(launch));
    if (token_cache_) {
      SLIMKV_RETURN_IF_ERROR(token_cache_->update(layer, {rows_.data(), launch.num_rows, launch.cache, compact_k_.data(),
                                                          compact_v_.data(), selected_blocks_}));
    }
    const PagedKvView compact{compact_k_.data(), compact_v_.data(), compact_tables_.data(), selected_blocks_,
                              shape_.num_kv_heads, shape_.head_dim};
    const size_t q_width = size_t(shape_.num_heads) * size_t(shape_.head_dim);
    for (size_t p = 0; p < parts_.size(); ++p) {
      const size_t first = size_t(parts_[p].first_query) * q_width;
      if (parts_[p].decode) {
        SLIMKV_RETURN_IF_ERROR(part_attention_[p]->run(compact, q + first, scale, out + first));
      } else {
        SLIMKV_RETURN_IF_ERROR(attend_store(*part_attention_[p], layer, q + first, scale, out + first));
      }
    }
    return Status::ok();
  }

  Status begin_fill(int sequence, int tokens) override {
    SLIMKV_RETURN_IF_ERROR(index_->begin_step({sequence}, {tokens}));
    plan_sealed_copies({sequence}, {tokens});
    return begin_store_step({sequence}, {tokens});
  }
  Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* /*x*/) override {
    SLIMKV_RETURN_IF_ERROR(append_to_store(layer, k, v));
    SLIMKV_RETURN_IF_ERROR(write_sealed_copies(layer));
    return index_->keep_keys(layer, k);
  }

  // Over sealed blocks: device pages as hack's (the pool in host memory with @offload: the copy kernels
  // read and write it through its mapping). FP16 pages have none (export_sequence below).
  DevicePages device_pages() const override { return sealed_ ? sealed_device_pages(*sealed_) : DevicePages{}; }

  // The sealed blocks copied in (and @offload's copies of their rows and V scales made), then the
  // index fed their keys dequantized (pq_sealed_keys) a step's tokens at a time, as fills feed it, then
  // the open tokens appended as fills append them.
  Status import_pages(int sequence, int blocks, const uint8_t* pages, const KvStore& open) override {
    if (!sealed_) return GpuKvCache::import_pages(sequence, blocks, pages, open);
    SLIMKV_RETURN_IF_ERROR(import_sealed_pages(*sealed_, sequence, blocks, pages, open.num_tokens(0)));
    const int sealed_tokens = blocks * kCudaBlockTokens, chunk = std::min(sealed_tokens, shape_.max_step_tokens);
    sealed_ranges_ = {{sequence, 0, sealed_tokens}};
    for (int l = 0; l < shape_.num_layers; ++l) SLIMKV_RETURN_IF_ERROR(write_sealed_copies(l));
    sealed_ranges_.clear();
    SLIMKV_ASSIGN_OR_RETURN(auto keys, DeviceArray<uint16_t>::allocate(size_t(std::max(chunk, 1)) * size_t(shape_.kv_dim()),
                                                                       "the imported blocks' keys"));
    for (int first = 0; first < sealed_tokens; first += chunk) {
      const int n = std::min(chunk, sealed_tokens - first);
      SLIMKV_RETURN_IF_ERROR(index_->begin_step({sequence}, {n}));
      for (int l = 0; l < shape_.num_layers; ++l) {
        SLIMKV_RETURN_IF_ERROR(pq_sealed_keys(sealed_tokens_of(l, {sequence, first, n}), keys.data()));
        SLIMKV_RETURN_IF_ERROR(index_->keep_keys(l, keys.data()));
      }
    }
    return append_store_rows(
        open, 0, open.num_tokens(0), shape_.max_step_tokens, [&](int n) { return begin_fill(sequence, n); },
        [&](int layer, const uint16_t* k, const uint16_t* v) { return fill(layer, k, v, nullptr); });
  }

  // A sequence in the transfer format (through a host KvStore, as the host tier's: kv_store_copy.h): the
  // pages' FP16 K/V, every full block a `dense:dtype=f16` block, then the open block's tokens. The PQ
  // index does not travel: import_sequence rebuilds it from the keys.
  Status export_sequence(int sequence, KvStore& into) const override {
    if (sealed_) return GpuKvCache::export_sequence(sequence, into);  // it has device pages
    // The steps' appends (kernels on the default stream; into the mapped host pool with @offload) first.
    SLIMKV_RETURN_IF_ERROR(device_synchronize("exporting a sequence of pq on device 'cuda'"));
    const int tokens = sequences().num_tokens(sequence), full = tokens / kCudaBlockTokens;
    const int open = tokens - full * kCudaBlockTokens;
    const std::vector<int>& blocks = sequences().blocks(sequence);
    const size_t head_page = size_t(kCudaBlockTokens) * size_t(shape_.head_dim);  // one head's K (or V) of a page
    std::vector<uint16_t> k, v, dense_block(2 * head_page);
    into.clear();
    for (int l = 0; l < shape_.num_layers; ++l) {
      for (int b = 0; b < full; ++b) {
        SLIMKV_RETURN_IF_ERROR(read_page(l, blocks[size_t(b)], k, v));
        for (int g = 0; g < shape_.num_kv_heads; ++g) {
          std::memcpy(dense_block.data(), k.data() + size_t(g) * head_page, head_page * 2);
          std::memcpy(dense_block.data() + head_page, v.data() + size_t(g) * head_page, head_page * 2);
          into.restore_sealed_block(l, g, reinterpret_cast<const uint8_t*>(dense_block.data()));
        }
      }
      if (open > 0) SLIMKV_RETURN_IF_ERROR(read_page(l, blocks[size_t(full)], k, v));
      restore_open_tokens_from_page(into, l, k, v, open);
    }
    return Status::ok();
  }

  // The sequence's K/V appended as fills append them: into the pages, and each layer's keys on their
  // way to the index, whose next begin_step clusters every full segment. A segment's codebook and codes
  // are a function of its keys and its seed (pq_segment_seed; the GPU index clusters a segment once,
  // when it is full), so the rebuilt index, and every selection, is the exporting cache's.
  Status import_sequence(int sequence, const KvStore& from) override {
    if (sealed_) return GpuKvCache::import_sequence(sequence, from);
    const int tokens = from.num_tokens(0);
    for (int l = 1; l < from.shape().num_layers; ++l) {
      if (from.num_tokens(l) != tokens) {
        return error("importing a sequence into pq on device 'cuda': layer ", l, " holds ", from.num_tokens(l),
                     " tokens and layer 0 ", tokens, "; a GPU cache's sequence holds one count in every layer");
      }
    }
    const int needed = sequences().blocks_to_grow(sequence, tokens);
    if (needed > sequences().free_blocks()) {
      return error("the ", options_.offload ? "host" : "GPU", " KV pool of pq has no room for the imported sequence: ",
                   needed, " blocks of ", kCudaBlockTokens, " tokens needed, ", sequences().free_blocks(), " free");
    }
    return append_store_rows(
        from, 0, tokens, shape_.max_step_tokens, [&](int n) { return begin_fill(sequence, n); },
        [&](int layer, const uint16_t* k, const uint16_t* v) { return fill(layer, k, v, nullptr); });
  }

 private:
  Status restore_open_layer(int sequence, int layer, KvStore& into) const override {
    if (!sealed_) return GpuKvCache::restore_open_layer(sequence, layer, into);
    return restore_sealed_open_layer(*sealed_, sequence, layer, into);
  }

  // --- The store: FP16 pages, or the quantized cache's sealed blocks and FP16 window ---
  size_t fp16_block_bytes() const {
    return size_t(shape_.num_layers) * size_t(shape_.num_kv_heads) * 2 * kCudaBlockTokens * size_t(shape_.head_dim) * 2;
  }
  Status begin_store_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens) {
    return sealed_ ? sealed_->begin_step(sequences, new_tokens) : pages_->begin_step(sequences, new_tokens);
  }
  Status append_to_store(int layer, const uint16_t* k, const uint16_t* v) {
    return sealed_ ? sealed_->append(layer, k, v) : pages_->append(layer, k, v);
  }
  // --- @offload's copies of sealed bytes: the keys' and values' token-major rows (pq_select.h's
  // PqTokenRows) in host memory, the blocks' per-column V scales (HACK's V layout; PqValueScales) on the
  // GPU; over FP16 pages, the full blocks' K/V in rows of a token's key and value (pq_fp16_row_copies) ---
  struct TokenRange {
    int sequence, first, n;
  };
  // `rows`: @offload keeps the copies (auto: over a codec's sealed blocks, not over FP16 pages).
  bool keeps_rows() const {
    const std::string& rows = options_.pq.rows;
    return options_.offload && (rows == "on" || (rows == "auto" && sealed_options_.has_value()));
  }
  int max_tokens() const { return shape_.blocks_per_sequence() * kCudaBlockTokens; }
  // A row per token, KV head and layer, in pinned host memory.
  struct RowPool {
    PinnedArray<uint8_t> pool;  // [layers, sequences, kv_heads, max_tokens, row_bytes]
    int row_bytes = 0;
  };
  size_t row_layer_bytes(const RowPool& rows) const {
    return size_t(shape_.max_sequences) * size_t(shape_.num_kv_heads) * size_t(max_tokens()) * size_t(rows.row_bytes);
  }
  Status allocate_rows(RowPool& rows, int row_bytes, const char* what) {
    rows.row_bytes = row_bytes;
    SLIMKV_ASSIGN_OR_RETURN(rows.pool, PinnedArray<uint8_t>::allocate(size_t(shape_.num_layers) * row_layer_bytes(rows), what));
    return Status::ok();
  }
  PqTokenRows rows_of(RowPool& rows, int layer) {
    if (rows.pool.data() == nullptr) return PqTokenRows{};
    return PqTokenRows{rows.pool.data() + size_t(layer) * row_layer_bytes(rows), rows.row_bytes, max_tokens()};
  }
  size_t value_scales_layer() const {
    return size_t(shape_.max_sequences) * size_t(shape_.num_kv_heads) * size_t(shape_.blocks_per_sequence()) * 2 *
           size_t(shape_.head_dim);
  }
  PqValueScales value_scales(int layer) {
    if (value_scales_.data() == nullptr) return PqValueScales{};
    return PqValueScales{value_scales_.data() + size_t(layer) * value_scales_layer(), shape_.blocks_per_sequence()};
  }
  PqSealedCopies copies_of(int layer) {
    if (!sealed_) {
      const PqTokenRows rows = rows_of(fp16_rows_, layer);
      return rows.rows ? pq_fp16_row_copies(rows.rows, shape_.head_dim, max_tokens()) : PqSealedCopies{};
    }
    return {rows_of(key_rows_, layer), rows_of(value_rows_, layer), value_scales(layer)};
  }
  SealedTokenRange sealed_tokens_of(int layer, TokenRange r) const {
    if (!sealed_) {
      const PagedKvView pages = pages_->view(layer);
      return {QuantizedKvView{}, pages.block_table_stride, shape_.num_kv_heads, shape_.head_dim, r.sequence, r.first, r.n, pages};
    }
    return {sealed_->sealed_view(layer), sealed_->shape().max_blocks_per_sequence, shape_.num_kv_heads, shape_.head_dim,
            r.sequence, r.first, r.n, PagedKvView{}};
  }
  // The tokens whose blocks the step seals (before the store's begin_step counts the step's tokens).
  void plan_sealed_copies(const std::vector<int>& sequence_ids, const std::vector<int>& new_tokens) {
    sealed_ranges_.clear();
    if (!keeps_rows()) return;
    for (size_t i = 0; i < sequence_ids.size(); ++i) {
      const int held = sequences().num_tokens(sequence_ids[i]);
      const int first = held / kCudaBlockTokens * kCudaBlockTokens;
      const int end = (held + new_tokens[i]) / kCudaBlockTokens * kCudaBlockTokens;
      if (end > first) sealed_ranges_.push_back({sequence_ids[i], first, end - first});
    }
  }
  // After the layer's append has sealed the blocks.
  Status write_sealed_copies(int layer) {
    for (const TokenRange& r : sealed_ranges_) {
      SLIMKV_RETURN_IF_ERROR(pq_copy_sealed(sealed_tokens_of(layer, r), copies_of(layer)));
    }
    return Status::ok();
  }

  // The FP16 pages, or the quantized cache's window (the open blocks and the step's).
  PagedKvView fp16_view(int layer) const { return sealed_ ? sealed_->view(layer) : pages_->view(layer); }
  // Attention of the planned sequences over every token they hold.
  Status attend_store(CudaPagedAttention& attention, int layer, const uint16_t* q, float scale, uint16_t* out) {
    if (sealed_) return attention.run_quantized(sealed_->view(layer), sealed_->sealed_view(layer), q, scale, out);
    return attention.run(pages_->view(layer), q, scale, out);
  }

  // Page `block` of `layer`, every KV head: k, v [num_kv_heads, kCudaBlockTokens, head_dim] FP16, copied
  // from GPU memory, or read in place from the pinned host pool (@offload: its mapping is the host's
  // address; the caller has synchronized with the GPU's writes).
  Status read_page(int layer, int block, std::vector<uint16_t>& k, std::vector<uint16_t>& v) const {
    const PagedKvView view = pages_->view(layer);
    if (!options_.offload) return download_page(view, block, k, v);
    const size_t page = size_t(shape_.num_kv_heads) * kCudaBlockTokens * size_t(shape_.head_dim);
    k.assign(view.k + size_t(block) * page, view.k + size_t(block + 1) * page);
    v.assign(view.v + size_t(block) * page, view.v + size_t(block + 1) * page);
    return Status::ok();
  }

  // The selection rule of topk_selector.h per decode row (a sequence with one query this step); the
  // middle ends where the clustered segments do (later tokens have no codes yet and are attended).
  void plan_rows(const PagedAttentionBatch& batch) {
    const TopkWindow& w = options_.pq.window;
    host_rows_.clear();
    row_query_.clear();
    size_t bytes_read = 0;  // per layer and KV head
    int query = 0;  // the sequence's first query in the step
    for (size_t i = 0; i < batch.sequence_ids.size(); query += batch.query_counts[i], ++i) {
      if (batch.query_counts[i] != 1) continue;
      PqSelectRow r;
      r.sequence = batch.sequence_ids[i];
      r.num_tokens = batch.kv_lens[i];
      r.trained_segments = index_->clustered_segments(r.sequence);
      const int sealed = r.num_tokens / kCudaBlockTokens * kCudaBlockTokens;
      r.init_end = std::min(w.init_tokens, r.num_tokens);
      r.middle_end = std::max(r.init_end, std::min({r.num_tokens - w.local_tokens, sealed,
                                                    r.trained_segments * options_.pq.segment_tokens}));
      const int middle = r.middle_end - r.init_end;
      r.k = w.topk_tokens(r.num_tokens);
      r.all = r.k >= middle || r.trained_segments == 0;
      if (r.all) {
        r.k = r.candidates = 0;
        r.selected = r.num_tokens;
      } else {
        r.candidates = std::min(middle, int(std::ceil(double(r.k) * options_.pq.rerank)));
        r.selected = r.init_end + r.k + (r.num_tokens - r.middle_end);
      }
      bytes_read += row_read_bytes(r);
      report_.selected_tokens += r.selected;
      report_.held_tokens += r.num_tokens;
      host_rows_.push_back(r);
      row_query_.push_back(query);
    }
    report_.page_bytes_read = bytes_read * size_t(shape_.num_kv_heads) * size_t(shape_.num_layers);
  }

  // Bytes one KV head's selection of row r reads from the store: the candidates' keys (the kept ones'
  // without a re-rank), the selected tokens' values and the other selected tokens' keys. FP16 pages:
  // 2 · head_dim bytes a key or value. Sealed: those in sealed blocks as dequantize_tokens reads them
  // (codes, K partitions' min and scale; per block touched the per-column V ones, counted for at most
  // one block per token: an upper bound, none where their copy is on the GPU), the open block's tokens
  // from the FP16 window in GPU memory.
  size_t row_read_bytes(const PqSelectRow& r) const {
    const int ranked = r.all ? 0 : r.candidates > r.k ? r.candidates : r.k;
    const int key_tokens = ranked + r.selected - r.k, value_tokens = r.selected;
    if (!sealed_) return size_t(key_tokens + value_tokens) * size_t(shape_.head_dim) * 2;
    const int open = r.num_tokens % kCudaBlockTokens, sealed_blocks = r.num_tokens / kCudaBlockTokens;
    const QuantizedBlockLayout& layout = sealed_->layout();
    const auto bytes = [&](int tokens, bool keys) {
      const int blocks = std::min(tokens, sealed_blocks);
      const size_t block_meta = dequantized_token_bytes(layout, 0, keys, !keys);
      const size_t token = dequantized_token_bytes(layout, 1, keys, !keys) - block_meta;
      const bool meta_on_gpu = !keys && value_scales_.data() != nullptr;
      return size_t(tokens) * token + (meta_on_gpu ? 0 : size_t(blocks) * block_meta);
    };
    return bytes(key_tokens - open, true) + bytes(value_tokens - open, false);
  }

  // The step's parts (runs of consecutive decode rows, or of other sequences) and their attention plans:
  // decode row r is sequence r of the compact buffer's tables; the others are the pages' sequences.
  Status plan_parts(const PagedAttentionBatch& batch) {
    parts_.clear();
    std::vector<PagedAttentionBatch> part_batches;
    int query = 0, row = 0;
    for (size_t i = 0; i < batch.sequence_ids.size(); query += batch.query_counts[i], ++i) {
      const bool decode = batch.query_counts[i] == 1;
      if (parts_.empty() || parts_.back().decode != decode) {
        parts_.push_back({decode, query});
        part_batches.emplace_back();
      }
      PagedAttentionBatch& part = part_batches.back();
      part.sequence_ids.push_back(decode ? row : batch.sequence_ids[i]);
      part.kv_lens.push_back(decode ? host_rows_[size_t(row)].selected : batch.kv_lens[i]);
      part.query_counts.push_back(batch.query_counts[i]);
      if (decode) ++row;
    }
    const PagedAttentionShape attention{shape_.num_heads, shape_.num_kv_heads, shape_.head_dim, shape_.max_sequences,
                                        shape_.max_step_tokens};
    while (part_attention_.size() < parts_.size()) {
      SLIMKV_ASSIGN_OR_RETURN(auto plan, CudaPagedAttention::create(attention));
      part_attention_.push_back(std::move(plan));
    }
    for (size_t p = 0; p < parts_.size(); ++p) SLIMKV_RETURN_IF_ERROR(part_attention_[p]->plan(part_batches[p]));
    return Status::ok();
  }

  // One query's FP16 [num_heads, head_dim].
  size_t query_row_bytes() const { return size_t(shape_.num_heads) * size_t(shape_.head_dim) * 2; }

  GpuKvShape shape_;
  PqKvOptions options_;
  std::optional<QuantizedKvOptions> sealed_options_;
  std::unique_ptr<CudaPagedKvCache> pages_;       // FP16 (sealed_options_ none)
  std::unique_ptr<CudaQuantizedKvCache> sealed_;  // sealed_options_
  std::unique_ptr<CudaPqIndex> index_;
  std::unique_ptr<CudaPagedAttention> full_attention_;  // a step without selection: every sequence over the pages
  // A step with selection: its parts, each with its attention plan (part_attention_[p], kept across steps).
  struct StepPart {
    bool decode = false;  // decode rows over the compact buffer; else sequences over the pages
    int first_query = 0;  // in the step
  };
  std::vector<StepPart> parts_;
  std::vector<std::unique_ptr<CudaPagedAttention>> part_attention_;
  std::unique_ptr<CudaPqTokenCache> token_cache_;  // @offload with cache != 0
  RowPool key_rows_;    // sealed @offload, HACK's K layout: the keys' rows
  RowPool value_rows_;  // sealed @offload: the values' rows
  RowPool fp16_rows_;   // FP16 pages @offload: a token's key and value a row
  DeviceArray<uint16_t> value_scales_;  // sealed @offload, HACK's V layout: [layers, sequences, kv_heads, blocks, 2, d]
  std::vector<TokenRange> sealed_ranges_;  // the step's sealed tokens
  int max_candidates_ = 0, selected_blocks_ = 0;
  DeviceArray<uint16_t> compact_k_, compact_v_, candidate_keys_;
  DeviceArray<int> compact_tables_, ranked_, kept_, lengths_, top_k_;
  DeviceArray<float> tables_, scores_, exact_;
  DeviceArray<PqSelectRow> rows_;
  std::vector<PqSelectRow> host_rows_;
  std::vector<int> row_query_;  // [host_rows_]: each decode row's query in the step
  // With prefill chunks in the step: the decode rows' queries gathered into rows (FP16 [max_sequences,
  // num_heads, head_dim]) from their byte offsets in the step's queries.
  bool gather_queries_ = false;
  DeviceArray<long long> decode_query_offsets_;
  DeviceArray<uint16_t> decode_queries_;
  bool select_ = false;
  SelectionReport report_;
};

}  // namespace

Expected<std::unique_ptr<GpuKvCache>> make_gpu_pq_kv(const GpuKvShape& shape, const PqKvOptions& options,
                                                     const std::optional<QuantizedKvOptions>& sealed, size_t kv_cache_bytes) {
  std::unique_ptr<GpuPqKv> cache(new GpuPqKv(shape, options, sealed));
  SLIMKV_RETURN_IF_ERROR(cache->init(kv_cache_bytes));
  return std::unique_ptr<GpuKvCache>(std::move(cache));
}

}  // namespace slimkv::cuda
