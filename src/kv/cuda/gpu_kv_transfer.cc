#include "kv/cuda/gpu_kv_transfer.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/ipc_memory.h"
#include "backend/cuda/pinned_memory.h"
#include "kv/transfer.h"

namespace slimkv::cuda {
namespace {

// `bytes` of pinned host memory for one layer at a time: the context's kept staging (grown if smaller),
// else `own`, this transfer's.
Expected<uint8_t*> layer_staging(const GpuKvTransferContext& context, size_t bytes, PinnedArray<uint8_t>& own, const char* what) {
  PinnedArray<uint8_t>& staging = context.staging ? *context.staging : own;
  if (staging.size() < bytes) {
    staging = PinnedArray<uint8_t>();  // the smaller one freed before the larger is pinned
    SLIMKV_ASSIGN_OR_RETURN(staging, PinnedArray<uint8_t>::allocate(bytes, what));
  }
  return staging.data();
}

}  // namespace

Status check_gpu_transfer_layout(const KvTransferInfo& info, std::string_view source) {
  for (size_t l = 0; l < info.layer_tokens.size(); ++l) {
    if (info.layer_tokens[l] != info.layer_tokens[0] || info.block_tokens != kCudaBlockTokens) {
      return error("kv transfer '", source, "': layer ", l, " holds ", info.layer_tokens[l], " tokens and layer 0 ",
                   info.layer_tokens[0], ", in blocks of ", info.block_tokens,
                   "; a GPU cache's sequence holds one count in every layer, in blocks of ", kCudaBlockTokens);
    }
  }
  return Status::ok();
}

// A cache with device pages: every layer's sealed blocks gathered on the device into one buffer (as
// CUDA IPC shares them), brought to the host a layer at a time by one copy into pinned memory, and
// written into the transfer straight from the pages; the open tokens (less than a block per layer)
// through a host store. A host tier's sequences go through a host store whole.
Status export_transfer(const GpuKvCache& kv, int sequence, const GpuKvTransferContext& context, std::vector<uint8_t>& out) {
  const KvPageLayout layout = kv.device_page_layout();
  if (layout.page_bytes == 0) {
    KvStore store(context.shape, context.pipeline);
    SLIMKV_RETURN_IF_ERROR(kv.export_sequence(sequence, store));
    return write_kv_transfer(store, context.model_id, out);
  }
  const int blocks = kv.sequences().num_tokens(sequence) / kCudaBlockTokens;
  const size_t layer_bytes = size_t(blocks) * layout.page_bytes;
  SLIMKV_ASSIGN_OR_RETURN(auto pages, DeviceArray<uint8_t>::allocate(size_t(context.shape.num_layers) * layer_bytes,
                                                                    "a KV export's sealed blocks"));
  SLIMKV_RETURN_IF_ERROR(kv.export_pages(sequence, blocks, pages.data()));
  PinnedArray<uint8_t> own;
  SLIMKV_ASSIGN_OR_RETURN(uint8_t* const staging, layer_staging(context, layer_bytes, own, "a KV export's layer in host memory"));
  KvStore open(context.shape, context.pipeline);
  SLIMKV_RETURN_IF_ERROR(kv.export_open_tokens(sequence, open));
  const auto layer_pages = [&](int layer) -> Expected<const uint8_t*> {
    SLIMKV_RETURN_IF_ERROR(copy_to_host(staging, pages.data() + size_t(layer) * layer_bytes, layer_bytes));
    return staging;
  };
  return write_kv_transfer_from_pages(layout, blocks, layer_pages, open, context.model_id, out);
}

// The transfer is checked against this cache's spec, model and shape first; then, with device pages,
// each layer's sealed blocks are laid out as pages in pinned memory and copied up into one device
// buffer, which the cache takes device to device (as from CUDA IPC), the open tokens through a host
// store. A host tier takes a host store of the whole sequence.
Status import_transfer(GpuKvCache& kv, int sequence, const GpuKvTransferContext& context,
                       std::span<const uint8_t> transfer, std::string_view source, std::optional<uint32_t> received_crc) {
  const std::string where = str_cat("kv transfer '", source, "'");
  const KvPageLayout layout = kv.device_page_layout();
  KvStore store(context.shape, context.pipeline);
  if (layout.page_bytes == 0) {
    SLIMKV_RETURN_IF_ERROR(read_kv_transfer(transfer.data(), transfer.size(), source, context.model_id, store, received_crc));
    return kv.import_sequence(sequence, store).with_context(where);
  }
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info,
                          check_kv_transfer_for(transfer.data(), transfer.size(), source, context.model_id, store, received_crc));
  SLIMKV_RETURN_IF_ERROR(check_gpu_transfer_layout(info, source));
  restore_kv_transfer_open_tokens(transfer.data(), info, store);
  const int blocks = info.layer_tokens.empty() ? 0 : info.layer_tokens[0] / kCudaBlockTokens;
  const size_t layer_bytes = size_t(blocks) * layout.page_bytes;
  SLIMKV_ASSIGN_OR_RETURN(auto pages, DeviceArray<uint8_t>::allocate(size_t(context.shape.num_layers) * layer_bytes,
                                                                    "a KV import's sealed blocks"));
  PinnedArray<uint8_t> own;
  SLIMKV_ASSIGN_OR_RETURN(uint8_t* const staging, layer_staging(context, layer_bytes, own, "a KV import's layer in host memory"));
  for (int l = 0; l < context.shape.num_layers; ++l) {
    copy_kv_transfer_pages(transfer.data(), info, l, layout, staging);
    SLIMKV_RETURN_IF_ERROR(copy_to_device(pages.data() + size_t(l) * layer_bytes, staging, layer_bytes));
  }
  return kv.import_pages(sequence, blocks, pages.data(), store).with_context(where);
}

Status export_to_device(const GpuKvCache& kv, int sequence, const GpuKvTransferContext& context, DeviceKvTransfer& out,
                        bool pages) {
  if (kv.device_page_bytes() == 0) {
    return error("KV export into GPU memory: this GPU cache (", context.pipeline.describe(), ") has no device pages");
  }
  out.num_layers = context.shape.num_layers;
  out.sealed_blocks = kv.sequences().num_tokens(sequence) / kCudaBlockTokens;
  out.page_bytes = kv.device_page_bytes();
  if (pages) {
    SLIMKV_ASSIGN_OR_RETURN(out.pages, shared_device_allocation(out.pages_bytes(), "a KV export in GPU memory"));
    SLIMKV_RETURN_IF_ERROR(kv.export_pages(sequence, out.sealed_blocks, static_cast<uint8_t*>(out.pages.get())));
  }
  KvStore open(context.shape, context.pipeline);
  SLIMKV_RETURN_IF_ERROR(kv.export_open_tokens(sequence, open));
  return write_kv_transfer(open, context.model_id, out.open);
}

Status import_from_device(GpuKvCache& kv, int sequence, const GpuKvTransferContext& context,
                          const DeviceKvTransfer& transfer, std::string_view source) {
  const std::string where = str_cat("kv transfer '", source, "'");
  if (kv.device_page_bytes() == 0) {
    return error(where, ": KV import from GPU memory: this GPU cache (", context.pipeline.describe(), ") has no device pages");
  }
  KvStore open(context.shape, context.pipeline);
  SLIMKV_RETURN_IF_ERROR(read_kv_transfer(transfer.open.data(), transfer.open.size(), source, context.model_id, open));
  const int num_layers = context.shape.num_layers;
  for (int l = 0; l < num_layers; ++l) {
    if (open.num_tokens(l) != open.num_tokens(0) || open.num_tokens(l) >= open.block_tokens()) {
      return error(where, ": the open tokens' transfer holds ", open.num_tokens(l), " tokens in layer ", l, " and ",
                   open.num_tokens(0), " in layer 0; expected one count below a block of ", open.block_tokens());
    }
  }
  if (transfer.num_layers != num_layers || transfer.page_bytes != kv.device_page_bytes() || transfer.sealed_blocks < 0 ||
      !transfer.pages) {
    return error(where, ": device pages of ", transfer.num_layers, " layers × ", transfer.sealed_blocks, " blocks × ",
                 transfer.page_bytes, " bytes; this GPU cache's are ", num_layers, " layers × blocks × ",
                 kv.device_page_bytes(), " bytes");
  }
  const int64_t tokens = int64_t(transfer.sealed_blocks) * kCudaBlockTokens + open.num_tokens(0);
  if (tokens > context.shape.max_tokens) {
    return error(where, ": ", tokens, " tokens, more than the context of ", context.shape.max_tokens);
  }
  return kv.import_pages(sequence, transfer.sealed_blocks, static_cast<const uint8_t*>(transfer.pages.get()), open)
      .with_context(where);
}

Expected<std::unique_ptr<LayerPagesUpload>> LayerPagesUpload::create(const KvPageLayout& layout, int num_layers, int blocks,
                                                                     ReusedArrays<PinnedArray<uint8_t>>& pinned) {
  if (layout.page_bytes == 0) return error("a staged KV import into GPU memory: this GPU cache has no device pages");
  std::unique_ptr<LayerPagesUpload> upload(new LayerPagesUpload());
  upload->gpu_ = current_device();
  upload->layout_ = layout;
  upload->num_layers_ = num_layers;
  upload->blocks_ = blocks;
  upload->layer_bytes_ = size_t(blocks) * layout.page_bytes;
  SLIMKV_ASSIGN_OR_RETURN(upload->pages_, shared_device_allocation(upload->pages_bytes(), "a staged KV import's sealed blocks"));
  for (std::shared_ptr<PinnedArray<uint8_t>>& layer : upload->pinned_) {
    SLIMKV_ASSIGN_OR_RETURN(layer, pinned.take(upload->layer_bytes_, "a staged KV import's layer in host memory"));
  }
  cudaStream_t stream = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  upload->stream_ = stream;
  for (void*& uploaded : upload->uploaded_) {
    cudaEvent_t event = nullptr;
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    uploaded = event;
  }
  return upload;
}

LayerPagesUpload::~LayerPagesUpload() {
  static_cast<void>(use_gpu(gpu_));
  if (stream_) static_cast<void>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  for (void* uploaded : uploaded_) {
    if (uploaded) static_cast<void>(cudaEventDestroy(static_cast<cudaEvent_t>(uploaded)));
  }
  if (stream_) static_cast<void>(cudaStreamDestroy(static_cast<cudaStream_t>(stream_)));
}

Status LayerPagesUpload::upload(int layer, int first_block, int count, const KvStore& store) {
  if (layer < 0 || layer >= num_layers_ || first_block < 0 || count < 0 || first_block + count > blocks_) {
    return error("a staged KV import into GPU memory: blocks [", first_block, ", ", first_block + count, ") of layer ",
                 layer, "; the import holds ", blocks_, " blocks in each of ", num_layers_, " layers");
  }
  if (count == 0) return Status::ok();  // no sealed block: the open tokens are all
  SLIMKV_RETURN_IF_ERROR(use_gpu(gpu_));
  const int slot = next_;
  next_ = 1 - next_;
  const auto uploaded = static_cast<cudaEvent_t>(uploaded_[slot]);
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploaded));  // the pinned buffer's last upload has left it
  copy_kv_store_pages(store, layer, first_block, count, layout_, pinned_[slot]->data());
  const auto stream = static_cast<cudaStream_t>(stream_);
  uint8_t* const to = static_cast<uint8_t*>(pages_.get()) + size_t(layer) * layer_bytes_ + size_t(first_block) * layout_.page_bytes;
  const size_t bytes = size_t(count) * layout_.page_bytes;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to, pinned_[slot]->data(), bytes, cudaMemcpyHostToDevice, stream));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded, stream));
  return Status::ok();
}

Expected<std::shared_ptr<void>> LayerPagesUpload::finish() {
  SLIMKV_RETURN_IF_ERROR(use_gpu(gpu_));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return pages_;
}

}  // namespace slimkv::cuda
