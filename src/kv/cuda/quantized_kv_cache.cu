#include "kv/cuda/quantized_kv_cache.h"

#include <algorithm>
#include <utility>

#include "backend/cuda/ipc_memory.h"

namespace slimkv::cuda {

namespace {

// Head i's layout (i = layer · num_kv_heads + head) at dims' K and V dims, after checking them.
Expected<QuantizedBlockLayout> head_layout(const CudaKvShape& shape, const QuantizationConfig& config, const HeadDims& dims,
                                           size_t i) {
  const int layer = int(i) / shape.num_kv_heads, head = int(i) % shape.num_kv_heads;
  const int k_dim = dims.k_dims[i], v_dim = dims.v_dims[i];
  if (k_dim < 4 || v_dim < 4 || k_dim % 4 != 0 || v_dim % 4 != 0 || k_dim > shape.head_dim || v_dim > shape.head_dim) {
    return error("CUDA quantized KV: layer ", layer, " KV head ", head, " has K/V dims ", k_dim, "/", v_dim,
                 ", expected multiples of 4 from 4 to head_dim ", shape.head_dim, " (ZACK ranks before a quantizing codec: ",
                 "align=4)");
  }
  const BlockShape block{kCudaBlockTokens, k_dim, v_dim};
  SLIMKV_RETURN_IF_ERROR(check_quantized_shape(config, block));
  return QuantizedBlockLayout(config, block);
}

Status check_head_dims(const CudaKvShape& shape, const QuantizationConfig& config, const HeadDims& dims) {
  const size_t heads = size_t(shape.num_layers) * size_t(shape.num_kv_heads);
  if (dims.k_dims.size() != heads || dims.v_dims.size() != heads) {
    return error("CUDA quantized KV: ", dims.k_dims.size(), " K and ", dims.v_dims.size(),
                 " V head dims, expected one per layer and KV head (", heads, ")");
  }
  // The kernels read ZACK's heads in HACK's layout (per-token K, per-column V) only.
  if (config.k_per_channel || config.v_per_token) {
    return error("CUDA quantized KV: heads of their own dims (zack) run with HACK's layout only, not klayout=channel or ",
                 "vlayout=token");
  }
  return Status::ok();
}

}  // namespace

Expected<size_t> CudaQuantizedKvCache::sealed_block_bytes(const CudaKvShape& shape, const QuantizationConfig& config,
                                                          const HeadDims& dims) {
  if (!dims.empty()) {
    SLIMKV_RETURN_IF_ERROR(check_head_dims(shape, config, dims));
    size_t bytes = 0;
    for (size_t i = 0; i < dims.k_dims.size(); ++i) {
      SLIMKV_ASSIGN_OR_RETURN(const QuantizedBlockLayout layout, head_layout(shape, config, dims, i));
      bytes += layout.block_bytes;
    }
    return bytes;
  }
  const BlockShape block{kCudaBlockTokens, shape.head_dim, shape.head_dim};
  SLIMKV_RETURN_IF_ERROR(check_quantized_shape(config, block));
  return size_t(shape.num_layers) * shape.num_kv_heads * QuantizedBlockLayout(config, block).block_bytes;
}

Status CudaQuantizedKvCache::lay_out_heads(const QuantizationConfig& config, const HeadDims& dims) {
  SLIMKV_RETURN_IF_ERROR(check_head_dims(shape_, config, dims));
  std::vector<QuantizedHeadLayout> layouts;
  size_t offset = 0;
  for (int l = 0; l < shape_.num_layers; ++l) {
    int stride = 0;
    for (int g = 0; g < shape_.num_kv_heads; ++g) {
      SLIMKV_ASSIGN_OR_RETURN(const QuantizedBlockLayout layout,
                              head_layout(shape_, config, dims, size_t(l) * size_t(shape_.num_kv_heads) + size_t(g)));
      layouts.push_back({stride, layout.shape.k_dim, layout.shape.v_dim, quantized_block_offsets(layout)});
      stride += int(layout.block_bytes);
      max_head_block_bytes_ = std::max(max_head_block_bytes_, int(layout.block_bytes));
    }
    block_strides_.push_back(size_t(stride));
    layer_offsets_.push_back(offset);
    offset += size_t(stride) * size_t(shape_.num_blocks);
  }
  SLIMKV_ASSIGN_OR_RETURN(head_layouts_, DeviceArray<QuantizedHeadLayout>::allocate(layouts.size(), "the sealed heads' layouts"));
  return head_layouts_.upload(layouts.data(), layouts.size());
}

Expected<std::unique_ptr<CudaQuantizedKvCache>> CudaQuantizedKvCache::create(const CudaKvShape& shape,
                                                                             const QuantizationConfig& config, bool hack,
                                                                             uint64_t seed, const HeadDims& dims) {
  SLIMKV_ASSIGN_OR_RETURN(QuantizedBlockSealer sealer,
                          QuantizedBlockSealer::create(config, hack, seed, shape.num_kv_heads, shape.head_dim));
  std::unique_ptr<CudaQuantizedKvCache> cache(new CudaQuantizedKvCache(shape, sealer));
  if (!dims.empty()) SLIMKV_RETURN_IF_ERROR(cache->lay_out_heads(config, dims));
  CudaKvShape window_shape = shape;
  window_shape.num_blocks = window_blocks(shape);
  window_shape.host_memory = false;
  SLIMKV_ASSIGN_OR_RETURN(cache->window_, CudaPagedKvCache::create(window_shape));
  const int last = shape.num_layers - 1;
  const size_t pool_bytes = cache->layer_offset(last) + cache->block_stride(last) * size_t(shape.num_blocks);
  if (shape.host_memory) {
    SLIMKV_ASSIGN_OR_RETURN(cache->host_pool_, PinnedArray<uint8_t>::allocate(pool_bytes, "the sealed block pool"));
    cache->pool_data_ = cache->host_pool_.data();
  } else {
    SLIMKV_ASSIGN_OR_RETURN(cache->pool_, DeviceArray<uint8_t>::allocate(pool_bytes, "the sealed block pool"));
    cache->pool_data_ = cache->pool_.data();
  }
  const size_t table_entries = size_t(shape.max_sequences) * shape.max_blocks_per_sequence;
  SLIMKV_ASSIGN_OR_RETURN(cache->sealed_tables_, DeviceArray<int>::allocate(table_entries, "the sealed block tables"));
  cache->host_sealed_tables_.assign(table_entries, 0);
  SLIMKV_RETURN_IF_ERROR(cache->sealed_tables_.upload(cache->host_sealed_tables_.data(), table_entries));
  // A step fills at most max_step_tokens / block tokens blocks, plus one per sequence it ends in.
  const size_t capacity = size_t(shape.max_step_tokens) / kCudaBlockTokens + size_t(shape.max_sequences);
  SLIMKV_ASSIGN_OR_RETURN(cache->seal_list_, DeviceArray<int>::allocate(3 * capacity, "the blocks to seal"));
  SLIMKV_ASSIGN_OR_RETURN(cache->block_rows_, DeviceArray<int>::allocate(2 * capacity, "the step rows of the blocks to seal"));
  return Expected<std::unique_ptr<CudaQuantizedKvCache>>(std::move(cache));
}

Expected<int> CudaQuantizedKvCache::add_sequence() {
  SLIMKV_ASSIGN_OR_RETURN(const int id, sealed_.add_sequence());
  // Both pools hand out the lowest free id, and sequences come and go in both together.
  SLIMKV_ASSIGN_OR_RETURN(const int window_id, window_->sequences().add_sequence());
  if (window_id != id) return error("CUDA quantized KV: sequence ids of the two pools differ (", id, ", ", window_id, ")");
  return id;
}

void CudaQuantizedKvCache::remove_sequence(int sequence) {
  sealed_.remove_sequence(sequence);
  window_->sequences().remove_sequence(sequence);
}

int CudaQuantizedKvCache::window_blocks_to_grow(const std::vector<int>& sequences, const std::vector<int>& new_tokens) const {
  const SequenceBlocks& window = window_->sequences();
  int needed = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    needed += window.blocks_to_grow(sequences[i], window.num_tokens(sequences[i]) + new_tokens[i]);
  }
  // What begin_step gives back first: every sequence's FP16 blocks before its open block.
  for (int s = 0; s < window.max_sequences(); ++s) {
    if (window.is_live(s)) needed -= std::max(0, window.num_tokens(s) / kCudaBlockTokens - window.released_blocks(s));
  }
  return needed;
}

Status CudaQuantizedKvCache::check_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens) const {
  if (sequences.size() != new_tokens.size()) {
    return error("CUDA quantized KV step: ", sequences.size(), " sequences but ", new_tokens.size(), " token counts");
  }
  int sealed_needed = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (!sealed_.is_live(sequences[i])) return error("CUDA quantized KV step: sequence ", sequences[i], " does not exist");
    const int total = sealed_.num_tokens(sequences[i]) + new_tokens[i];
    if ((total + kCudaBlockTokens - 1) / kCudaBlockTokens > shape_.max_blocks_per_sequence) {
      return error("CUDA quantized KV step: sequence ", sequences[i], " would hold ", total, " tokens, over the ",
                   shape_.max_blocks_per_sequence * kCudaBlockTokens, " its block table allows");
    }
    sealed_needed += sealed_.blocks_to_grow(sequences[i], total);
  }
  if (sealed_needed > sealed_.free_blocks()) {
    return error("the GPU's sealed KV pool is full: the step needs ", sealed_needed, " more blocks of ", kCudaBlockTokens,
                 " tokens, ", sealed_.free_blocks(), " are free (of ", sealed_.num_blocks(), ")");
  }
  const int window_needed = window_blocks_to_grow(sequences, new_tokens);
  if (window_needed > window_->sequences().free_blocks()) {
    return error("the GPU's FP16 window of quantized KV is full: the step needs ", window_needed, " more blocks, ",
                 window_->sequences().free_blocks(), " are free (of ", window_->sequences().num_blocks(),
                 "; max_step_tokens and max_sequences size it)");
  }
  return Status::ok();
}

Status CudaQuantizedKvCache::begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens) {
  SLIMKV_RETURN_IF_ERROR(check_step(sequences, new_tokens));
  SequenceBlocks& window = window_->sequences();
  for (int s = 0; s < window.max_sequences(); ++s) {
    if (window.is_live(s)) window.release_leading(s, window.num_tokens(s) / kCudaBlockTokens);
  }
  SLIMKV_RETURN_IF_ERROR(window_->begin_step(sequences, new_tokens));
  std::vector<int> seal_list, block_rows;  // block_rows: QuantizedBlockSealer::StepRows's
  int first_row = 0;                      // the sequence's first row in the step
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int s = sequences[i], held = sealed_.num_tokens(s), total = held + new_tokens[i];
    SLIMKV_RETURN_IF_ERROR(sealed_.grow(s, total).with_context("CUDA quantized KV step"));
    const std::vector<int>& blocks = sealed_.blocks(s);
    for (size_t b = 0; b < blocks.size(); ++b) host_sealed_tables_[size_t(s) * shape_.max_blocks_per_sequence + b] = blocks[b];
    for (int ordinal = held / kCudaBlockTokens; ordinal < total / kCudaBlockTokens; ++ordinal) {
      seal_list.insert(seal_list.end(), {window.blocks(s)[size_t(ordinal)], blocks[size_t(ordinal)], ordinal});
      const int first_new = std::max(held, ordinal * kCudaBlockTokens);
      block_rows.insert(block_rows.end(), {first_new - ordinal * kCudaBlockTokens, first_row + first_new - held});
    }
    first_row += new_tokens[i];
  }
  seal_count_ = int(seal_list.size() / 3);
  SLIMKV_RETURN_IF_ERROR(sealed_tables_.upload(host_sealed_tables_.data(), host_sealed_tables_.size()));
  if (seal_count_ == 0) return Status::ok();
  if (seal_list.size() > seal_list_.size()) {
    return error("CUDA quantized KV: ", seal_count_, " blocks to seal in one step, over the ", seal_list_.size() / 3, " planned");
  }
  SLIMKV_RETURN_IF_ERROR(block_rows_.upload(block_rows.data(), block_rows.size()));
  return seal_list_.upload(seal_list.data(), seal_list.size());
}

Status CudaQuantizedKvCache::append(int layer, const uint16_t* k, const uint16_t* v) {
  if (seal_count_ == 0) return window_->append(layer, k, v);
  const QuantizedBlockSealer::StepRows rows{k, v, window_->step_slots(), window_->step_tokens(), block_rows_.data()};
  const SealedHeadBlocks heads{heads_differ() ? head_layouts_.data() + size_t(layer) * shape_.num_kv_heads : nullptr,
                                               heads_differ() ? (long long)block_stride(layer) : 0};
  return sealer_.append_and_seal(layer, window_->view(layer), rows, seal_list_.data(), seal_count_,
                                 pool_data_ + layer_offset(layer), heads);
}

Status CudaQuantizedKvCache::restore_sealed(int sequence, int blocks, const uint8_t* sealed, bool on_device) {
  if (sealed_.num_tokens(sequence) != 0) return error("CUDA quantized KV: restoring into sequence ", sequence, ", which is not empty");
  if (heads_differ()) return error("CUDA quantized KV: restoring sealed blocks of heads of their own dims (zack) is not supported yet");
  // A pool in host memory is written by the copy kernel through its mapping; the host's copies are not.
  if (shape_.host_memory && !on_device) {
    return error("CUDA quantized KV: restoring host blocks into a pool in host memory is not supported yet");
  }
  SLIMKV_RETURN_IF_ERROR(sealed_.grow(sequence, blocks * kCudaBlockTokens).with_context("restoring sealed KV blocks"));
  window_->sequences().skip_leading(sequence, blocks);
  const size_t bytes = size_t(shape_.num_kv_heads) * sealer_.layout().block_bytes;
  const std::vector<int>& ids = sealed_.blocks(sequence);
  if (on_device) {
    std::vector<uint64_t> to, from;
    for (int l = 0; l < shape_.num_layers; ++l) {
      for (int b = 0; b < blocks; ++b) {
        to.push_back(uint64_t(l) * layer_bytes() + uint64_t(ids[size_t(b)]) * bytes);
        from.push_back((uint64_t(l) * uint64_t(blocks) + uint64_t(b)) * bytes);
      }
    }
    SLIMKV_RETURN_IF_ERROR(copy_device_pieces(pool_data_, to, sealed, from, bytes));
  }
  for (int l = 0; l < shape_.num_layers && !on_device; ++l) {
    for (int b = 0; b < blocks; ++b) {
      SLIMKV_RETURN_IF_ERROR(copy_to_device(pool_data_ + size_t(l) * layer_bytes() + size_t(ids[size_t(b)]) * bytes,
                                            sealed + (size_t(l) * size_t(blocks) + size_t(b)) * bytes, bytes));
    }
  }
  for (size_t b = 0; b < ids.size(); ++b) host_sealed_tables_[size_t(sequence) * shape_.max_blocks_per_sequence + b] = ids[b];
  return sealed_tables_.upload(host_sealed_tables_.data(), host_sealed_tables_.size());
}

QuantizedKvView CudaQuantizedKvCache::sealed_view(int layer) const {
  QuantizedKvView view = sealer_.view(pool_data_ + layer_offset(layer), sealed_tables_.data());
  if (heads_differ()) {
    view.heads = head_layouts_.data() + size_t(layer) * shape_.num_kv_heads;
    view.block_stride = (long long)block_stride(layer);
    view.offsets.block_bytes = max_head_block_bytes_;  // what a kernel stages at most
  }
  return view;
}

size_t CudaQuantizedKvCache::bytes() const {
  const CudaKvShape& w = window_->shape();
  return pool_.bytes() + size_t(w.num_layers) * w.num_blocks * w.num_kv_heads * 2 * kCudaBlockTokens * w.head_dim * 2;
}

}  // namespace slimkv::cuda
