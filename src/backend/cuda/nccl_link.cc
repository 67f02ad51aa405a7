#include "backend/cuda/nccl_link.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>


#ifdef SLIMKV_HAVE_NCCL_H
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/ipc_memory.h"
#endif

namespace slimkv::cuda {

#ifndef SLIMKV_HAVE_NCCL_H

class NcclLink {};

namespace {
Status no_nccl() {
  return error("NCCL transport: this build has no NCCL (nccl.h was not found beside the CUDA toolkit when it was "
               "configured); install NCCL and configure again");
}
}  // namespace

Status nccl_available() { return no_nccl(); }
Expected<NcclId> nccl_new_id() { return no_nccl(); }
Expected<std::shared_ptr<NcclLink>> nccl_connect(const NcclId&, int, int, std::chrono::milliseconds) { return no_nccl(); }
Status nccl_send(NcclLink&, const void*, uint64_t, uint64_t, const std::function<void(uint64_t)>&, std::chrono::milliseconds) {
  return no_nccl();
}
Status nccl_receive(NcclLink&, void*, uint64_t, uint64_t, std::chrono::milliseconds) { return no_nccl(); }
Status nccl_wait(NcclLink&, std::chrono::milliseconds) { return no_nccl(); }
bool nccl_link_broken(const NcclLink&) { return true; }

#else

namespace {

static_assert(sizeof(ncclUniqueId) == kNcclIdBytes, "ncclUniqueId is 128 bytes");

// The part of NCCL's API links use, from libnccl.so.2 opened at the first use (the plugin does not link
// it: a host without NCCL still loads the plugin).
struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
};

Expected<const NcclApi*> nccl_api() {
  static const Expected<NcclApi> api = []() -> Expected<NcclApi> {
    // The issue's rule for the GPU machines: never NVLink multicast (it is a collective feature; a link
    // of two ranks sends and receives only, so nothing is lost).
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      return error("NCCL transport: libnccl.so.2 could not be opened (", dlerror(),
                   "): install NCCL (it comes with the CUDA toolkit's or PyTorch's NCCL package) or add its folder to "
                   "LD_LIBRARY_PATH");
    }
    NcclApi loaded;
    Status missing = Status::ok();
    const auto bind = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(library, name));
      if (function == nullptr && missing.is_ok()) missing = error("NCCL transport: libnccl.so.2 has no ", name, " (NCCL 2.14 or later is needed)");
    };
    bind(loaded.get_unique_id, "ncclGetUniqueId");
    bind(loaded.init_rank_config, "ncclCommInitRankConfig");
    bind(loaded.get_async_error, "ncclCommGetAsyncError");
    bind(loaded.abort, "ncclCommAbort");
    bind(loaded.send, "ncclSend");
    bind(loaded.recv, "ncclRecv");
    bind(loaded.error_string, "ncclGetErrorString");
    bind(loaded.last_error, "ncclGetLastError");
    if (!missing.is_ok()) return missing;
    return loaded;
  }();
  if (!api) return api.status();
  return &*api;
}

}  // namespace

class NcclLink {
 public:
  NcclLink(const NcclApi& api, ncclComm_t comm, cudaStream_t stream, int rank, int gpu)
      : api_(api), comm_(comm), stream_(stream), peer_(1 - rank), gpu_(gpu) {}
  ~NcclLink() {
    // Closed by whichever thread lets go last: on the link's GPU, as every call on it.
    static_cast<void>(use_gpu(gpu_));
    // Aborted, not finalized: ncclCommFinalize waits until the communicator is quiescent on every rank,
    // i.e. until the other worker closes its end too (a decode worker shutting down would wait for its
    // prefill workers). No operation is in flight here (each one completes, or breaks the link, before
    // run() returns), so an abort loses nothing and frees this side's resources at once.
    api_.abort(comm_);
    cudaStreamDestroy(stream_);
  }
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  bool broken() const { return broken_; }
  int peer() const { return peer_; }
  int gpu() const { return gpu_; }

  // Issues `op` (a ncclSend or ncclRecv of one piece on this link's stream); wait() waits for it.
  template <typename Op>
  Status issue(Op op, std::chrono::milliseconds timeout, const char* what) {
    if (broken_) return error("NCCL link: ", what, ": the link failed before and is not used again");
    const ncclResult_t issued = op(comm_, stream_);
    if (issued != ncclSuccess && issued != ncclInProgress) return fail(issued, what);
    return wait_for_comm(timeout, what);
  }

  // Waits until everything issued on the link's stream is done.
  Status wait(std::chrono::milliseconds timeout, const char* what) {
    if (broken_) return error("NCCL link: ", what, ": the link failed before and is not used again");
    return poll(timeout, what, [&]() -> std::optional<Status> {
      const cudaError_t done = cudaStreamQuery(stream_);
      if (done == cudaSuccess) return Status::ok();
      if (done != cudaErrorNotReady) {
        cudaGetLastError();
        broken_ = true;
        return error("NCCL link: ", what, ": ", cudaGetErrorName(done), " (", cudaGetErrorString(done), ")");
      }
      ncclResult_t state = ncclSuccess;
      api_.get_async_error(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) return fail(state, what);
      return std::nullopt;
    });
  }

  // Waits until the communicator has no call in progress (a non-blocking communicator's calls return
  // before they are done).
  Status wait_for_comm(std::chrono::milliseconds timeout, const char* what) {
    return poll(timeout, what, [&]() -> std::optional<Status> {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t asked = api_.get_async_error(comm_, &state);
      if (asked != ncclSuccess) return fail(asked, what);
      if (state == ncclSuccess) return Status::ok();
      if (state != ncclInProgress) return fail(state, what);
      return std::nullopt;
    });
  }

 private:
  // Calls `step` (a status when done or failed, nullopt to keep waiting) until the deadline, which
  // breaks the link: a peer that died or never came leaves it unusable.
  template <typename Step>
  Status poll(std::chrono::milliseconds timeout, const char* what, Step step) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (std::optional<Status> result = step()) return *result;
      if (std::chrono::steady_clock::now() > deadline) {
        broken_ = true;
        return error("NCCL link: ", what, " did not complete within ", std::chrono::duration<double>(timeout).count(),
                     " s: is the other worker alive?");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Status fail(ncclResult_t result, const char* what) {
    broken_ = true;
    const char* detail = api_.last_error(comm_);
    return error("NCCL link: ", what, ": ", api_.error_string(result), detail != nullptr && *detail ? str_cat(" (", detail, ")") : "");
  }

  const NcclApi& api_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  const int peer_;  // the other rank
  const int gpu_;   // the visible GPU the link's communicator and stream are on
  bool broken_ = false;
};

Status nccl_available() { return nccl_api().status(); }

Expected<NcclId> nccl_new_id() {
  SLIMKV_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  ncclUniqueId id{};
  if (const ncclResult_t made = api->get_unique_id(&id); made != ncclSuccess) {
    return error("NCCL transport: ncclGetUniqueId: ", api->error_string(made));
  }
  NcclId bytes{};
  std::memcpy(bytes.data(), &id, kNcclIdBytes);
  return bytes;
}

Expected<std::shared_ptr<NcclLink>> nccl_connect(const NcclId& id, int rank, int gpu, std::chrono::milliseconds timeout) {
  if (rank != 0 && rank != 1) return error("NCCL link: rank ", rank, "; a link has ranks 0 and 1");
  SLIMKV_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  // The communicator belongs to the device current when it is made (ncclCommInitRank's rule).
  SLIMKV_RETURN_IF_ERROR(use_gpu(gpu));
  cudaStream_t stream = nullptr;
  if (const cudaError_t made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); made != cudaSuccess) {
    cudaGetLastError();
    return error("NCCL link: creating its CUDA stream: ", cudaGetErrorString(made));
  }
  ncclUniqueId unique{};
  std::memcpy(&unique, id.data(), kNcclIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait bounded by our deadline, not NCCL's
  ncclComm_t comm = nullptr;
  const ncclResult_t started = api->init_rank_config(&comm, 2, unique, rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    cudaStreamDestroy(stream);
    if (comm != nullptr) api->abort(comm);
    return error("NCCL link: joining as rank ", rank, ": ", api->error_string(started));
  }
  auto link = std::make_shared<NcclLink>(*api, comm, stream, rank, gpu);
  SLIMKV_RETURN_IF_ERROR(link->wait_for_comm(timeout, rank == 0 ? "waiting for the receiver to join" : "joining the sender"));
  return link;
}

namespace {

// The pieces of `bytes`: `piece_bytes` each (0: one piece), the last one shorter.
template <typename Each>
Status for_each_piece(uint64_t bytes, uint64_t piece_bytes, Each each) {
  const uint64_t step = piece_bytes == 0 ? bytes : piece_bytes;
  for (uint64_t offset = 0; offset < bytes; offset += step) SLIMKV_RETURN_IF_ERROR(each(offset, std::min(step, bytes - offset)));
  return Status::ok();
}

}  // namespace

Status nccl_send(NcclLink& link, const void* data, uint64_t bytes, uint64_t piece_bytes,
                 const std::function<void(uint64_t)>& before_piece, std::chrono::milliseconds timeout) {
  SLIMKV_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  SLIMKV_RETURN_IF_ERROR(use_gpu(link.gpu()));
  const auto* from = static_cast<const uint8_t*>(data);
  return for_each_piece(bytes, piece_bytes, [&](uint64_t offset, uint64_t size) {
    if (before_piece) before_piece(size);
    return link.issue([&](ncclComm_t comm, cudaStream_t stream) { return api->send(from + offset, size, ncclUint8, link.peer(), comm, stream); },
                      timeout, "sending KV blocks");
  });
}

Status nccl_receive(NcclLink& link, void* to, uint64_t bytes, uint64_t piece_bytes, std::chrono::milliseconds timeout) {
  SLIMKV_ASSIGN_OR_RETURN(const NcclApi* api, nccl_api());
  SLIMKV_RETURN_IF_ERROR(use_gpu(link.gpu()));
  auto* into = static_cast<uint8_t*>(to);
  return for_each_piece(bytes, piece_bytes, [&](uint64_t offset, uint64_t size) {
    return link.issue([&](ncclComm_t comm, cudaStream_t stream) { return api->recv(into + offset, size, ncclUint8, link.peer(), comm, stream); },
                      timeout, "receiving KV blocks");
  });
}

Status nccl_wait(NcclLink& link, std::chrono::milliseconds timeout) {
  SLIMKV_RETURN_IF_ERROR(use_gpu(link.gpu()));
  return link.wait(timeout, "moving KV blocks");
}

bool nccl_link_broken(const NcclLink& link) { return link.broken(); }

#endif

}  // namespace slimkv::cuda
