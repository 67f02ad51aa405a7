// A decode worker's staged import (docs/disaggregated.md, "Staged imports"): one incoming KV stream
// placed where its request will run, layer by layer as the stream's frames land, so that when the
// request joins the batch little or nothing is left for the scheduler's thread to do (a GPU worker that
// imported a whole 16K-token FP16 transfer at join held its scheduler 0.75 s on an H100, stalling every
// running request's decode).
//
// One orchestration for every device, driven by the KV stream's receiver on the stream's own thread
// (KvStreamReceiver): the transfer's blocks are reserved in the KV budget from HELLO when it announces
// the tokens (Engine::reserve_kv), and the staging made then from the head those tokens lay out
// (Engine::kv_transfer_head), else by Engine::new_kv_staging once the head has arrived, which also
// checks the head against the engine's KV; each piece of a layer is restored into
// store() as soon as it has landed and been checksummed; layer_complete(l) once layer l is whole, layers
// in order (blocks_restored for blocks that came before their layer's frame, in a stream laid out at
// HELLO); finish() once the stream has checked out end to end. The device's part (its placement) is
// what blocks_restored and layer_complete do and what finish() hands over:
//   cpu:  the store is the sequence's KV to be (the scheduler's Engine::adopt_kv takes it): nothing to place;
//   cuda: the sealed blocks laid out as the GPU cache's pages and uploaded into GPU memory on a stream of
//         the placement's own, never the steps', as they land (early blocks) or with their layer, while
//         later layers are on the wire; finish()
//         waits for the last upload and hands the pages over as a DeviceKvTransfer, which the scheduler
//         imports device to device (Engine::import_kv_from_device), as one that came by CUDA IPC.
// A staging dropped before finish() (its stream failed or was replaced) frees what it placed and lets its
// reservation go; after finish() the reservation travels with the KV (StagedKv) to the scheduler.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kv/store.h"
#include "kv/transfer.h"
#include "slimkv/device_kv_transfer.h"
#include "slimkv/engine.h"
#include "slimkv/status.h"

namespace slimkv {

// A staged stream's KV as the scheduler takes it (SubmitOptions::Resume): `store` (CPU) or `device` (GPU).
struct StagedKv {
  std::shared_ptr<KvStore> store;
  std::shared_ptr<const DeviceKvTransfer> device;
  std::shared_ptr<KvReservation> reservation;  // null for a staging made outside an engine (stage_into_store)
};

class KvStaging {
 public:
  virtual ~KvStaging() = default;
  KvStaging(const KvStaging&) = delete;
  KvStaging& operator=(const KvStaging&) = delete;

  // The store the stream's pieces are restored into: cleared, its spec and shape the head's.
  KvStore& store() { return *store_; }
  const KvTransferInfo& info() const { return info_; }
  // Layer `layer`'s sealed blocks [first_block, first_block + count) are in store(), before the layer's
  // frame (KV_BLOCKS restored as they landed: a stream laid out at HELLO), in order for each layer: a
  // device may place them now (the GPU uploads them). The CPU's placement has nothing to do.
  virtual Status blocks_restored(int /*layer*/, int /*first_block*/, int /*count*/) { return Status::ok(); }
  // Layer `layer` is whole in store() (layers come in order): its sealed blocks, and its open tokens,
  // whose records (the transfer's open range of the layer, checked) are `open_records`.
  virtual Status layer_complete(int layer, const uint8_t* open_records) = 0;
  // Every layer complete and the stream checked end to end: the KV, with the reservation.
  Expected<StagedKv> finish();

 protected:
  // `store`: an empty store of the receiving KV; `model_id`: the receiver's. Checks the head against it
  // (check_kv_transfer_head_for) and clears it.
  KvStaging(std::shared_ptr<KvStore> store, const KvTransferInfo& info, std::string_view source);
  Status check_head(std::string_view model_id);
  // finish()'s device part: `out`'s store or device filled.
  virtual Status finish_placing(StagedKv& out) = 0;

  std::shared_ptr<KvStore> store_;
  const KvTransferInfo info_;
  const std::string source_;

 private:
  friend class Engine;
  std::shared_ptr<KvReservation> reservation_;
};

// The CPU's placement: the store is the KV (StagedKv::store). Also for a receiver that stages into a
// store of its own (a benchmark, a test): `store` holds the transfer's spec and shape.
Expected<std::unique_ptr<KvStaging>> stage_into_store(std::shared_ptr<KvStore> store, const KvTransferInfo& info,
                                                      std::string_view source, std::string_view model_id);

}  // namespace slimkv
