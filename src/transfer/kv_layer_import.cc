#include "transfer/kv_layer_import.h"

namespace slimkv {

Expected<std::unique_ptr<KvLayerImport>> KvLayerImport::start(const uint8_t* transfer, const KvTransferInfo& info,
                                                             std::shared_ptr<KvStore> store, std::string_view model_id,
                                                             std::string where) {
  SLIMKV_RETURN_IF_ERROR(check_kv_transfer_head_for(info, where, model_id, *store));
  store->clear();
  std::unique_ptr<KvLayerImport> import(new KvLayerImport(transfer, info, std::move(store), std::move(where)));
  import->thread_ = std::thread([raw = import.get()] { raw->restore_layers(); });
  return import;
}

KvLayerImport::~KvLayerImport() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void KvLayerImport::arrived() {
  {
    std::lock_guard lock(mutex_);
    ++arrived_;
  }
  changed_.notify_all();
}

void KvLayerImport::restore_layers() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || arrived_ > restored_; });
    if (stopping_ || !status_.is_ok() || restored_ == info_.shape.num_layers) return;
    const int layer = restored_;
    lock.unlock();
    // The bytes of layers before arrived_ are written and never touched again by the receiver.
    Status status = check_kv_transfer_layer_for(transfer_, info_, layer, where_, *store_);
    if (status.is_ok()) restore_kv_transfer_layer(transfer_, info_, layer, *store_);
    lock.lock();
    status_ = std::move(status);
    ++restored_;
    changed_.notify_all();
  }
}

Expected<std::shared_ptr<KvStore>> KvLayerImport::finish() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !status_.is_ok() || restored_ == info_.shape.num_layers; });
  SLIMKV_RETURN_IF_ERROR(status_);
  return store_;
}

}  // namespace slimkv
