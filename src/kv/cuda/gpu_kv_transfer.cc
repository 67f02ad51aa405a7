#include "kv/cuda/gpu_kv_transfer.h"

#include "backend/cuda/ipc_memory.h"
#include "kv/transfer.h"

namespace slimkv::cuda {

Status export_transfer(const GpuKvCache& kv, int sequence, const GpuKvTransferContext& context, std::vector<uint8_t>& out) {
  KvStore store(context.shape, context.pipeline);
  SLIMKV_RETURN_IF_ERROR(kv.export_sequence(sequence, store));
  return write_kv_transfer(store, context.model_id, out);
}

// The transfer's reader checks it against this cache's spec, model and shape into a host store; the
// cache then takes the blocks as they are.
Status import_transfer(GpuKvCache& kv, int sequence, const GpuKvTransferContext& context,
                       std::span<const uint8_t> transfer, std::string_view source) {
  KvStore store(context.shape, context.pipeline);
  SLIMKV_RETURN_IF_ERROR(read_kv_transfer(transfer.data(), transfer.size(), source, context.model_id, store));
  return kv.import_sequence(sequence, store).with_context(str_cat("kv transfer '", source, "'"));
}

Status export_to_device(const GpuKvCache& kv, int sequence, const GpuKvTransferContext& context, DeviceKvTransfer& out) {
  if (kv.device_page_bytes() == 0) {
    return error("KV export into GPU memory: this GPU cache (", context.pipeline.describe(), ") has no device pages");
  }
  out.num_layers = context.shape.num_layers;
  out.sealed_blocks = kv.sequences().num_tokens(sequence) / kCudaBlockTokens;
  out.page_bytes = kv.device_page_bytes();
  SLIMKV_ASSIGN_OR_RETURN(out.pages, shared_device_allocation(out.pages_bytes(), "a KV export in GPU memory"));
  SLIMKV_RETURN_IF_ERROR(kv.export_pages(sequence, out.sealed_blocks, static_cast<uint8_t*>(out.pages.get())));
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

}  // namespace slimkv::cuda
