#include "engine/kv_staging.h"

#include <utility>

namespace slimkv {

KvStaging::KvStaging(std::shared_ptr<KvStore> store, const KvTransferInfo& info, std::string_view source)
    : store_(std::move(store)), info_(info), source_(source) {}

Status KvStaging::check_head(std::string_view model_id) {
  SLIMKV_RETURN_IF_ERROR(check_kv_transfer_head_for(info_, source_, model_id, *store_));
  store_->clear();
  return Status::ok();
}

Expected<StagedKv> KvStaging::finish() {
  StagedKv out;
  SLIMKV_RETURN_IF_ERROR(finish_placing(out));
  out.reservation = std::move(reservation_);
  return out;
}

namespace {

class StoreStaging final : public KvStaging {
 public:
  StoreStaging(std::shared_ptr<KvStore> store, const KvTransferInfo& info, std::string_view source)
      : KvStaging(std::move(store), info, source) {}
  Status start(std::string_view model_id) { return check_head(model_id); }
  Status layer_complete(int, const uint8_t*) override { return Status::ok(); }  // restored in place already

 private:
  Status finish_placing(StagedKv& out) override {
    out.store = std::move(store_);
    return Status::ok();
  }
};

}  // namespace

Expected<std::unique_ptr<KvStaging>> stage_into_store(std::shared_ptr<KvStore> store, const KvTransferInfo& info,
                                                      std::string_view source, std::string_view model_id) {
  auto staging = std::make_unique<StoreStaging>(std::move(store), info, source);
  SLIMKV_RETURN_IF_ERROR(staging->start(model_id));
  return std::unique_ptr<KvStaging>(std::move(staging));
}

}  // namespace slimkv
