#include "engine/cuda/gpu_kv_staging.h"

#include <string>
#include <utility>
#include <vector>

#include "kv/cuda/gpu_kv_transfer.h"
#include "kv/store.h"

namespace slimkv::cuda {
namespace {

class GpuKvStaging final : public KvStaging {
 public:
  GpuKvStaging(const KvTransferInfo& info, std::string_view source, std::string_view model_id, const KvShape& shape,
               const KvPipeline& pipeline, uint64_t page_bytes)
      : KvStaging(std::make_shared<KvStore>(shape, pipeline), info, source),
        model_id_(model_id),
        open_(shape, pipeline),
        page_bytes_(page_bytes) {}

  Status start(const KvPageLayout& layout, ReusedArrays<PinnedArray<uint8_t>>& pinned) {
    SLIMKV_RETURN_IF_ERROR(check_head(model_id_));
    SLIMKV_RETURN_IF_ERROR(check_gpu_transfer_layout(info_, source_));
    blocks_ = info_.layer_tokens.empty() ? 0 : info_.layer_tokens[0] / kCudaBlockTokens;
    uploaded_.assign(size_t(info_.shape.num_layers), 0);
    SLIMKV_ASSIGN_OR_RETURN(upload_, LayerPagesUpload::create(layout, info_.shape.num_layers, blocks_, pinned));
    return Status::ok();
  }

  // Blocks that came before their layer's frame (a GPU prefill sends nearly all of its KV so) go up as
  // they land; each layer's rest once it is whole.
  Status blocks_restored(int layer, int first_block, int count) override {
    SLIMKV_RETURN_IF_ERROR(upload_->upload(layer, first_block, count, *store_));
    uploaded_[size_t(layer)] = first_block + count;
    return Status::ok();
  }
  Status layer_complete(int layer, const uint8_t* open_records) override {
    SLIMKV_RETURN_IF_ERROR(restore_kv_transfer_open(open_records, info_, layer, source_, open_));
    const int uploaded = uploaded_[size_t(layer)];
    return upload_->upload(layer, uploaded, blocks_ - uploaded, *store_);
  }

 private:
  Status finish_placing(StagedKv& out) override {
    auto device = std::make_shared<DeviceKvTransfer>();
    device->num_layers = info_.shape.num_layers;
    device->sealed_blocks = blocks_;
    device->page_bytes = page_bytes_;
    SLIMKV_ASSIGN_OR_RETURN(device->pages, upload_->finish());
    SLIMKV_RETURN_IF_ERROR(write_kv_transfer(open_, model_id_, device->open));
    store_ = nullptr;  // the blocks live in GPU memory now: their host copy goes
    out.device = std::move(device);
    return Status::ok();
  }

  const std::string model_id_;
  KvStore open_;  // each layer's tokens after its last full block, as DeviceKvTransfer::open carries them
  const uint64_t page_bytes_;
  int blocks_ = 0;  // full blocks per layer
  std::vector<int> uploaded_;  // per layer: blocks uploaded as they landed (blocks_restored)
  std::unique_ptr<LayerPagesUpload> upload_;
};

}  // namespace

Expected<std::unique_ptr<KvStaging>> new_gpu_kv_staging(const KvTransferInfo& info, std::string_view source,
                                                         std::string_view model_id, const KvShape& shape,
                                                         const KvPipeline& pipeline, const KvPageLayout& layout,
                                                         ReusedArrays<PinnedArray<uint8_t>>& pinned) {
  auto staging = std::make_unique<GpuKvStaging>(info, source, model_id, shape, pipeline, layout.page_bytes);
  SLIMKV_RETURN_IF_ERROR(staging->start(layout, pinned));
  return std::unique_ptr<KvStaging>(std::move(staging));
}

}  // namespace slimkv::cuda
