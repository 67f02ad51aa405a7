// A link between two processes on two GPUs of one host through NCCL (a communicator of two ranks), for
// the KV stream's NCCL path (docs/kv_stream_protocol.md, "NCCL"): a prefill worker sends a sequence's
// sealed blocks from its GPU memory, a decode worker receives them into its own, over NVLink or PCIe
// as NCCL finds the way, never through host memory. Behind a header that needs no CUDA or NCCL headers.
//
// NCCL is not a Debian package: it comes with the GPU machine's CUDA or PyTorch install. The plugin is
// built with NCCL's header when the toolkit has one and opens libnccl.so.2 only when a link is first
// asked for, so a host without NCCL still runs everything else and gets a message naming what is missing.
//
// Every wait is bounded: a peer that dies or never joins ends in an error after the deadline, and the
// communicator is aborted (a link that failed once is not used again). NVLink multicast (NVLS) is off.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "slimkv/status.h"

namespace slimkv::cuda {

// ncclUniqueId: made by the rank that starts a link (rank 0), passed to the other out of band (the KV
// stream's handshake), and given by both to nccl_connect.
inline constexpr size_t kNcclIdBytes = 128;
using NcclId = std::array<uint8_t, kNcclIdBytes>;

class NcclLink;

// Whether links can be made here; the error says why not: a build without NCCL's header, or
// libnccl.so.2 not found (the loader's message).
Status nccl_available();
// A new id (the caller becomes rank 0 of its link). Rank 0 waits for the other to join from here on:
// make one only for a peer that has agreed to join.
Expected<NcclId> nccl_new_id();

// Joins the link `id` as `rank` (0 or 1) on visible GPU `gpu`; the other process must join too before
// `timeout`. The link has a CUDA stream of its own, and every later call on it (from any thread) runs on
// that GPU.
Expected<std::shared_ptr<NcclLink>> nccl_connect(const NcclId& id, int rank, int gpu, std::chrono::milliseconds timeout);

// Sends `bytes` of device memory at `data` to the other rank in pieces of at most `piece_bytes`
// (the receiver must use the same), calling `before_piece(bytes)` before each (e.g. a bandwidth cap);
// returns when the last piece is issued on the link's stream: `data` must stay until nccl_wait. A
// failure or the deadline breaks the link.
Status nccl_send(NcclLink& link, const void* data, uint64_t bytes, uint64_t piece_bytes,
                 const std::function<void(uint64_t)>& before_piece, std::chrono::milliseconds timeout);
// Receives `bytes` from the other rank into device memory `to` of the link's GPU (pieces as sent);
// issued like nccl_send's, the bytes there after nccl_wait.
Status nccl_receive(NcclLink& link, void* to, uint64_t bytes, uint64_t piece_bytes, std::chrono::milliseconds timeout);
// Waits until every send and receive issued on the link is done (issuing many before one wait keeps
// the link busy: a wait per small piece costs more than the piece).
Status nccl_wait(NcclLink& link, std::chrono::milliseconds timeout);
// Whether the link failed (or was aborted): it must not be used again.
bool nccl_link_broken(const NcclLink& link);

}  // namespace slimkv::cuda
