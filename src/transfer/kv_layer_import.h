// A received KV transfer restored into a store a layer at a time while its later layers are still on
// the wire (the KV stream receiver with KvStreamReceiverOptions::staging_store): a thread of its own
// restores each layer as soon as the receiver has it whole and checked by its frame's CRC, so that the
// copy into the store overlaps the reading of the next layers. The store is not a sequence of the
// engine until the engine adopts it (Engine::adopt_kv), once the whole transfer checks out; a stream
// that fails drops this object, and with it the store and everything restored so far.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "kv/store.h"
#include "kv/transfer.h"
#include "slimkv/status.h"

namespace slimkv {

class KvLayerImport {
 public:
  // `transfer`: where the receiver assembles the transfer (info.total_bytes, which stay in place until
  // this object is gone); `info`: its head's (inspect_kv_transfer_head). The head is checked against
  // `store` (empty; the receiving engine's spec and shape, model `model_id`) before anything starts.
  // `where` names the stream in errors.
  static Expected<std::unique_ptr<KvLayerImport>> start(const uint8_t* transfer, const KvTransferInfo& info,
                                                       std::shared_ptr<KvStore> store, std::string_view model_id,
                                                       std::string where);
  ~KvLayerImport();  // a layer being restored is finished, the rest dropped, the thread joined

  // The next layer (0, 1, ... in order) is in place in the transfer, its frame's CRC checked.
  void arrived();
  // Once every layer has arrived: waits for the last to be restored. The store, or the first layer's
  // error (its open tokens are not what this spec's open block holds).
  Expected<std::shared_ptr<KvStore>> finish();

 private:
  KvLayerImport(const uint8_t* transfer, const KvTransferInfo& info, std::shared_ptr<KvStore> store, std::string where)
      : transfer_(transfer), info_(info), store_(std::move(store)), where_(std::move(where)) {}
  void restore_layers();  // the thread

  const uint8_t* const transfer_;
  const KvTransferInfo info_;
  std::shared_ptr<KvStore> store_;
  const std::string where_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0, restored_ = 0;  // layers
  bool stopping_ = false;
  Status status_;  // the first layer refused
  std::thread thread_;
};

}  // namespace slimkv
