// The GPU's placement of a staged import (engine/kv_staging.h): each complete layer's sealed blocks
// uploaded into GPU memory as the cache's pages while later layers are still on the wire
// (cuda::LayerPagesUpload: laid out in pinned memory and copied up on a stream of its own, never the
// steps'), each layer's open tokens kept in a store of their own; finish() hands both over as a
// DeviceKvTransfer, which the scheduler's import_kv_from_device takes device to device when the request
// joins. It is import_kv's work on a whole transfer (every layer laid out as pages in pinned memory,
// uploaded, then taken device to device) moved off the scheduler's thread and overlapped with the
// stream: the same pages, byte for byte (copy_kv_store_pages of a store restored from the transfer is
// copy_kv_transfer_pages of the transfer).
#pragma once

#include <memory>
#include <string_view>

#include "backend/cuda/pinned_memory.h"
#include "backend/cuda/reused_arrays.h"
#include "engine/kv_staging.h"
#include "kv/kv_factory.h"
#include "kv/transfer.h"

namespace slimkv::cuda {

// On the calling thread's GPU: the head `info` checked against a store of `shape` and `pipeline` (the
// host stores of the cache's sequences) and the cache's layout (check_gpu_transfer_layout), the pages'
// GPU memory taken, the pinned layers from `pinned`.
Expected<std::unique_ptr<KvStaging>> new_gpu_kv_staging(const KvTransferInfo& info, std::string_view source,
                                                         std::string_view model_id, const KvShape& shape,
                                                         const KvPipeline& pipeline, const KvPageLayout& layout,
                                                         ReusedArrays<PinnedArray<uint8_t>>& pinned);

}  // namespace slimkv::cuda
