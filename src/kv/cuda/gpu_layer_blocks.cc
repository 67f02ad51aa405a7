#include "kv/cuda/gpu_layer_blocks.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/ipc_memory.h"

namespace slimkv::cuda {

Expected<std::shared_ptr<GpuLayerBlocks>> GpuLayerBlocks::create(const GpuKvCache& kv, int sequence, int first_block,
                                                                 int end_block, PinnedPool& pinned, DevicePool* device,
                                                                 std::shared_ptr<std::atomic<uint64_t>> held_bytes) {
  const GpuKvCache::DevicePages pages = kv.device_pages();
  if (pages.pools.empty()) return error("streaming KV blocks during a step: this GPU KV cache has no device pages");
  const std::vector<int>& ids = kv.sequences().blocks(sequence);
  if (first_block < 0 || first_block > end_block || size_t(end_block) > ids.size()) {
    return error("streaming KV blocks [", first_block, ", ", end_block, ") of a sequence that holds ", ids.size());
  }
  const int layers = pages.num_layers, blocks = end_block - first_block;
  const size_t heads = pages.pools[0].block_bytes / pages.pools[0].head_bytes;
  const KvPageLayout layout = kv.device_page_layout();
  size_t head_block_bytes = 0;  // a head's block in the transfer: its piece of every part
  for (const GpuKvCache::PagePool& part : pages.pools) head_block_bytes += part.head_bytes;
  std::shared_ptr<GpuLayerBlocks> out(new GpuLayerBlocks());
  out->gpu_ = current_device();
  out->first_block_ = first_block;
  out->blocks_ = blocks;
  out->page_bytes_ = layout.page_bytes;
  out->layer_data_bytes_ = size_t(blocks) * layout.page_bytes;  // = heads · blocks · head_block_bytes
  const size_t num_pieces = size_t(layers) * pages.pools.size() * heads * size_t(blocks);
  const size_t table_bytes = 2 * num_pieces * sizeof(uint64_t), data_bytes = size_t(layers) * out->layer_data_bytes_;
  SLIMKV_ASSIGN_OR_RETURN(out->host_, pinned.take(table_bytes + (device ? 0 : data_bytes),
                                                  "a streamed sequence's KV blocks in host memory"));
  if (device) {
    SLIMKV_ASSIGN_OR_RETURN(out->on_device_, device->take(data_bytes, "a streamed sequence's KV blocks in GPU memory"));
    out->data_ = out->on_device_->data();
  } else {
    out->data_ = out->host_->data() + table_bytes;
  }
  auto* dst = reinterpret_cast<uint64_t*>(out->host_->data());
  uint64_t* src = dst + num_pieces;
  out->dst_addresses_ = dst;
  out->src_addresses_ = src;
  // Piece (layer, part, head, block): from the part's pool to the head's run of blocks in the layer
  // (host: the transfer's order), or to the block's page (device).
  const uintptr_t data = reinterpret_cast<uintptr_t>(out->data_);
  size_t piece = 0;
  out->copies_.resize(size_t(layers));
  for (int l = 0; l < layers; ++l) {
    size_t part_offset = 0;  // in a head's block of the transfer
    for (size_t p = 0; p < pages.pools.size(); ++p) {
      const GpuKvCache::PagePool& part = pages.pools[p];
      PartCopies copies{.first_piece = piece, .count = heads * size_t(blocks), .piece_bytes = part.head_bytes};
      for (size_t h = 0; h < heads; ++h) {
        for (int b = 0; b < blocks; ++b, ++piece) {
          const size_t block_id = size_t(ids[size_t(first_block + b)]);
          const size_t layer_offset = size_t(l) * out->layer_data_bytes_;
          dst[piece] = data + layer_offset +
                       (device ? size_t(b) * layout.page_bytes + layout.piece_offsets[p] + h * part.head_bytes
                               : (h * size_t(blocks) + size_t(b)) * head_block_bytes + part_offset);
          src[piece] = reinterpret_cast<uintptr_t>(part.base) + size_t(l) * part.layer_bytes + block_id * part.block_bytes +
                       h * part.head_bytes;
        }
      }
      copies.alignment = std::min(piece_alignment(part.head_bytes, dst + copies.first_piece, copies.count),
                                  piece_alignment(part.head_bytes, src + copies.first_piece, copies.count));
      out->copies_[size_t(l)].push_back(copies);
      part_offset += part.head_bytes;
    }
  }
  out->events_.assign(size_t(layers), nullptr);
  for (void*& event : out->events_) {
    cudaEvent_t made = nullptr;
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&made, cudaEventDisableTiming));
    event = made;
  }
  out->held_bytes_ = std::move(held_bytes);
  if (out->held_bytes_) *out->held_bytes_ += data_bytes;
  return out;
}

GpuLayerBlocks::~GpuLayerBlocks() {
  if (held_bytes_) *held_bytes_ -= events_.size() * layer_data_bytes_;
  static_cast<void>(use_gpu(gpu_));  // events are destroyed on their GPU (a broken context has nothing to report)
  for (void* event : events_) {
    if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
}

Status GpuLayerBlocks::enqueue(int layer) {
  for (const PartCopies& copies : copies_.at(size_t(layer))) {
    SLIMKV_RETURN_IF_ERROR(enqueue_piece_copies(dst_addresses_ + copies.first_piece, src_addresses_ + copies.first_piece,
                                                copies.count, copies.piece_bytes, copies.alignment));
  }
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(events_.at(size_t(layer)))));
  return Status::ok();
}

Status GpuLayerBlocks::wait(int layer) const {
  SLIMKV_RETURN_IF_ERROR(use_gpu(gpu_));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(events_.at(size_t(layer)))));
  return Status::ok();
}

std::span<const uint8_t> GpuLayerBlocks::layer_bytes(int layer) const {
  return {data_ + size_t(layer) * layer_data_bytes_, layer_data_bytes_};
}

std::shared_ptr<const DeviceKvTransfer> GpuLayerBlocks::layer_pages(int layer) const {
  auto pages = std::make_shared<DeviceKvTransfer>();
  pages->num_layers = 1;
  pages->sealed_blocks = blocks_;
  pages->page_bytes = page_bytes_;
  // A view of the layer's pages that keeps the whole allocation.
  pages->pages = std::shared_ptr<void>(on_device_, const_cast<uint8_t*>(data_) + size_t(layer) * layer_data_bytes_);
  return pages;
}

}  // namespace slimkv::cuda
