// The KV stream: how a prefill worker hands one request's KV to a decode worker over TCP
// (docs/kv_stream_protocol.md is the specification). The KV travels in the transfer format of
// docs/kv_transfer_format.md, cut into a frame per layer (sealed blocks still encoded by the codec, then
// the open block), after a handshake that refuses, before any KV byte moves, a receiver whose model,
// KV spec, format version, block size or shape differ, naming both sides' values:
//
//   sender                                   receiver (listens on the decode worker's --kv-port)
//   HELLO {identity, request_id, attempt} ─►
//                                          ◄─ ACCEPT {identity}  |  REFUSE {error}
//   KV_BLOCKS (layer, first block, blocks)─►  (zero or more: a long prompt's earlier chunks, as they are
//                                               computed: Engine::stream_sealed_kv)
//   KV_HEAD (header + metadata)           ─►
//   KV_LAYER 0, 1, ..., num_layers - 1     ─►  (each as soon as the layer is ready: Engine::stream_kv_in_next_step;
//                                               the layer's sealed blocks after those sent in KV_BLOCKS)
//   FINISH (trailer + tokens + request)   ─►
//                                          ◄─ DONE {kv_bytes}  |  FAILED {error}
//
// Every frame is checked by a CRC32C (transfer/kv_frame.h); every read and write has a deadline.
//
// CUDA IPC (both workers on one GPU): a sender that offers it in HELLO (its GPU's UUID) and a receiver
// on the same GPU that accepts it in ACCEPT replace KV_BLOCKS, KV_HEAD and KV_LAYER by one KV_DEVICE
// frame: a cudaIpcMemHandle of the sender's copy of the sealed blocks (in GPU memory), which the
// receiver copies device to device into its own memory, and the few open tokens as a transfer of
// their own. Everything else (handshake, refusals, FINISH, DONE/FAILED) is unchanged.
//
// NCCL (workers on two GPUs of one host): a sender that offers it in HELLO and a receiver that accepts
// it in ACCEPT join (or reuse) an NCCL link between the two processes (transfer/nccl_links.h); KV_DEVICE
// then announces the sealed blocks, which follow through the link from the sender's GPU memory into
// the receiver's, never through host memory. The rest is as for CUDA IPC.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/kv_staging.h"
#include "slimkv/engine.h"
#include "slimkv/status.h"
#include "transfer/kv_frame.h"
#include "transfer/nccl_links.h"
#include "transfer/tcp_connection.h"
#include "transfer/token_bucket.h"
#include "util/buffer_pool.h"

namespace slimkv {

struct CudaPlugin;

inline constexpr uint32_t kKvStreamVersion = 3;  // this protocol's version (HELLO's stream_version)

// What the two sides must agree on before any KV byte moves.
struct KvStreamIdentity {
  std::string model_id;  // Engine::model_identity(): the weights that computed the KV
  std::string kv_spec;   // the canonical spec (Engine::kv_description())
  uint32_t transfer_format_version = 0;
  int block_tokens = 0;
  uint64_t sealed_block_bytes = 0;  // the largest head's when they differ
  int num_layers = 0, num_kv_heads = 0, k_dim = 0, v_dim = 0;  // per-head dims as stored (the widest head's)
  // Each (layer, KV head)'s sealed block bytes, layer by layer, when they differ (ZACK's ranks, hiheads=:
  // transfer format version 2); empty when every head's is sealed_block_bytes. A frame's blocks are then
  // each head's in slots of its own size.
  std::vector<uint64_t> head_block_bytes;
};
nlohmann::json kv_identity_json(const KvStreamIdentity& identity);
Expected<KvStreamIdentity> parse_kv_identity(const nlohmann::json& json, const std::string& where);
// "" when they agree; else every field that differs with both values ("kv_spec: the prefill worker's
// 'a', this decode worker's 'b'; ...").
std::string kv_identity_mismatch(const KvStreamIdentity& sender, const KvStreamIdentity& receiver);
// The identity of the transfers `engine` writes (read from the transfer of an empty sequence). The
// engine must have room for one more sequence (call it before a scheduler takes the engine).
Expected<KvStreamIdentity> engine_kv_identity(Engine& engine);
// The identity a transfer declares (that of the store that wrote it).
Expected<KvStreamIdentity> transfer_kv_identity(std::span<const uint8_t> transfer);

// What travels beside the KV: the request, so that the receiver continues it exactly.
struct KvStreamRequest {
  std::string request_id;  // the router's (HELLO)
  int attempt = 0;         // a later attempt for the same id replaces an earlier one (HELLO)
  std::vector<int32_t> prompt_token_ids;  // the prompt as the sender tokenized it (FINISH)
  std::vector<int32_t> resume_token_ids;  // tokens already generated elsewhere, run after the prompt
  int32_t next_token = -1;  // sampled by the sender after prompt + resume: the next generated token
  std::string endpoint;     // "/v1/completions" or "/v1/chat/completions"
  nlohmann::json request;   // the client's request body
};

// Visible GPU `gpu` (`--device cuda:N`) as the CUDA IPC path names it (its UUID, the same whatever index
// each process gives it); "" in builds without CUDA or without that GPU: such a worker neither offers
// nor accepts CUDA IPC.
std::string cuda_ipc_device_id(int gpu);

// --- the sender ---

struct KvStreamSendOptions {
  double bandwidth_gbps = 0;  // token-bucket cap on what goes out (Gbit/s); 0: none
  // cuda_ipc_device_id() of a sender whose KV is in GPU memory: offers the CUDA IPC path (used when the
  // receiver is on the same GPU); "": the KV goes over TCP.
  std::string cuda_ipc_device{};
  // The sender's NCCL links (by the receiver's address) when its KV is in GPU memory: offers the NCCL
  // path (used when the receiver takes it and CUDA IPC is not taken); nullptr: not offered. Over NCCL
  // the KV is paced by bandwidth_gbps as over TCP.
  NcclLinks* nccl_links = nullptr;
  // cuda_ipc_device_id() of the sender's GPU, sent with the NCCL offer whatever the path: a receiver on
  // the same GPU declines NCCL (it cannot join two ranks on one device) and the KV goes over TCP.
  std::string gpu_device{};
  int gpu = 0;  // the visible GPU whose memory the KV leaves from (`--device cuda:N`'s N)
  // The tokens the stream's KV holds at its end (prompt and tokens run after it): a receiver of blocks
  // sent over NCCL before the end (send_device_blocks) sizes its pages by it. 0: unknown (none sent so).
  int64_t total_tokens = 0;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds io_timeout{30000};  // per frame, and for the receiver's answers
};

// One stream, driven frame by frame: open() (the handshake), send_blocks() for sealed blocks ready early
// (any layers, each layer's in order), send_head(), send_layer() for every layer in order (a producer
// calls it as each layer is ready), finish(). After an error the stream is dead.
class KvStreamSender {
 public:
  // Connects to `address` and does the handshake. An error when the receiver refused (refused() is
  // then true on the sender given back through `refused`) or could not be reached.
  static Expected<std::unique_ptr<KvStreamSender>> open(const std::string& address, const KvStreamIdentity& identity,
                                                        const std::string& request_id, int attempt,
                                                        const KvStreamSendOptions& options, bool* refused);
  // Sealed blocks of `layer` from `first_block` on, every head's, head by head (write_kv_transfer_blocks),
  // before the head. Blocks already sent are skipped (a prompt computed again after a preemption seals
  // the same blocks again); a gap after the blocks sent is an error.
  // head_crcs (empty, or one per KV head): each head's part's CRC32C as its writer computed it
  // (write_kv_transfer_blocks): the frame does not read the bytes for it again.
  Status send_blocks(int layer, int first_block, std::span<const uint8_t> blocks, std::span<const uint32_t> head_crcs = {});
  // Bytes [0, sealed_offset) of the transfer: its header and metadata.
  Status send_head(std::span<const uint8_t> head);
  // The layer's sealed blocks from `first_block` on (skipping, as send_blocks, those sent), then its open
  // tokens. part_crcs (empty, or one per KV head then one for `open`): as write_kv_transfer_layer gives them.
  Status send_layer(int layer, int first_block, std::span<const uint8_t> sealed, std::span<const uint8_t> open,
                    std::span<const uint32_t> part_crcs = {});
  // The whole KV in GPU memory (only when kv_on_device()). Over CUDA IPC its sealed blocks stay where
  // they are, shared by a handle, and `kv` is kept alive until finish() has the receiver's answer; over
  // NCCL they are sent through the link before this returns, which the stream holds until finish().
  Status send_device(std::shared_ptr<const DeviceKvTransfer> kv);
  // Over NCCL, before send_device: a layer's blocks from `first_block` as pages in GPU memory (`blocks`:
  // one layer's, KvStreamForm::kDeviceLayers's pieces), sent through the link as the prefill seals them;
  // send_device then carries the layout and open tokens alone. Each layer's in order; blocks already
  // sent are skipped (a recomputed prompt), a gap or an overlap is an error.
  Status send_device_blocks(int layer, int first_block, const DeviceKvTransfer& blocks);
  // Whether the receiver accepted the CUDA IPC path, or the NCCL path: then send the KV by send_device,
  // not in pieces.
  bool cuda_ipc() const { return cuda_ipc_; }
  bool nccl() const { return nccl_link_ != nullptr; }
  bool kv_on_device() const { return cuda_ipc() || nccl(); }
  const char* transport() const { return cuda_ipc() ? "cuda_ipc" : nccl() ? "nccl" : "tcp"; }
  // One piece as an engine hands it out (Engine::stream_sealed_kv, stream_kv_in_next_step): the head,
  // a layer's early blocks, a layer's rest, or (device) the whole KV in GPU memory.
  Status send_piece(const KvTransferPiece& piece);
  // The transfer's trailer (its CRC32C over the head and layers sent, in the transfer's order) and the
  // request; waits for the receiver's DONE (an error quotes its FAILED).
  Status finish(const KvStreamRequest& request);
  // All of the above for a whole transfer (an export_kv result), a layer at a time.
  Status send_transfer(std::span<const uint8_t> transfer, const KvStreamRequest& request);
  uint64_t bytes_sent() const { return bytes_sent_; }

  // Where the stream's time went, for a prefill worker's answer (docs/disaggregated.md, "Where the
  // overlap went"): on the sender's thread, the seconds inside its frames' writes (CRCs of parts
  // without one, the socket, the cap) and the part of them slept for the cap; and the receiver's own
  // account, as its DONE gave it (empty before finish()).
  struct Timing {
    double frames_seconds = 0;
    double paced_seconds = 0;
    nlohmann::json receiver = nlohmann::json::object();
  };
  Timing timing() const { return {.frames_seconds = frames_seconds_, .paced_seconds = bucket_.waited_seconds(), .receiver = receiver_timing_}; }

 private:
  KvStreamSender(TcpConnection connection, const KvStreamIdentity& identity, const KvStreamSendOptions& options);
  // ACCEPT's "nccl" for the link offered in HELLO (`nccl`, held by the caller): joins a new link, or
  // forgets one the receiver no longer has (that stream goes over TCP).
  Status take_nccl_answer(const nlohmann::json& answer, const std::string& address, std::shared_ptr<NcclPeerLink> nccl);
  Status send_over_nccl(const CudaPlugin& plugin, std::shared_ptr<const DeviceKvTransfer> kv);
  // The NCCL link held for this stream from its first device send until finish() (NCCL pairs sends and
  // receives in the order they are issued); an error when it failed in another stream.
  Status hold_nccl_link(const CudaPlugin& plugin);
  // The link's piece size: a capped link goes in pieces, each paced as TCP's frames are.
  uint64_t nccl_piece_bytes() const { return bucket_.capped() ? uint64_t(16) << 20 : 0; }
  // Pages through the link, issued and held until a wait, which lets them go.
  Status send_nccl_pages(const CudaPlugin& plugin, std::shared_ptr<const void> pages, uint64_t bytes);
  Status wait_for_nccl(const CudaPlugin& plugin);
  // A failure on the link: the link forgotten when it broke, the error named as this stream's.
  Status nccl_failed(const CudaPlugin& plugin, const Status& failure);
  static constexpr uint64_t kMaxNcclBytesInFlight = uint64_t(256) << 20;
  // KV_DEVICE or KV_DEVICE_BLOCKS: u32 length, `header` (JSON), then `tail`.
  Status send_device_frame(KvFrameType type, const nlohmann::json& header, std::span<const uint8_t> tail = {});
  // part_crcs: as write_kv_frame's.
  Status send(KvFrameType type, std::span<const std::span<const uint8_t>> parts, uint32_t* part_crcs = nullptr,
              std::span<const std::optional<uint32_t>> known_crcs = {});
  // The frame's known_crcs for [prefix, each head's part, then `extra` more parts]: the writer's CRCs of
  // the heads' parts (and of the extra parts) when it gave them for exactly these parts (no block
  // skipped: `skip` 0), else none.
  std::vector<std::optional<uint32_t>> known_part_crcs(std::span<const uint32_t> writer_crcs, int skip, size_t extra) const;
  // Each head's part of `blocks` (`count` blocks of every head of `layer`, head by head) less its first
  // `skip` blocks, in place.
  std::vector<std::span<const uint8_t>> head_parts(int layer, std::span<const uint8_t> blocks, int count, int skip) const;
  TcpConnection connection_;
  const KvStreamIdentity identity_;
  KvStreamSendOptions options_;
  bool cuda_ipc_ = false;
  std::shared_ptr<const DeviceKvTransfer> device_kv_;  // send_device's, until the receiver's answer
  // The NCCL link the receiver accepted (kept in options_.nccl_links under address_), held by
  // send_device until finish() has the receiver's answer.
  std::string address_;
  std::shared_ptr<NcclPeerLink> nccl_link_;
  std::unique_lock<std::mutex> nccl_hold_;
  TokenBucket bucket_;
  uint64_t bytes_sent_ = 0;
  double frames_seconds_ = 0;
  nlohmann::json receiver_timing_ = nlohmann::json::object();
  // The transfer's CRC so far (the head, then each layer's sealed blocks), joined from the CRCs the
  // frames took of their parts (crc32c_combine): no byte is checksummed twice.
  struct PartCrc {
    uint32_t crc = 0;
    uint64_t bytes = 0;
    void append(uint32_t part_crc, uint64_t part_bytes);
  };
  uint32_t crc_ = 0;
  // The open tokens of every layer sent, which the transfer's order puts after all sealed blocks.
  std::vector<PartCrc> open_crcs_;
  // Per layer: sealed blocks sent (each head's), and per head the CRC of its blocks sent in KV_BLOCKS,
  // which the transfer's CRC takes head by head once the layer's last frame goes.
  std::vector<int> blocks_sent_;
  std::vector<int> device_blocks_sent_;  // per layer: blocks sent by send_device_blocks
  std::vector<std::shared_ptr<const void>> in_flight_;  // pages issued on the NCCL link, not yet waited for
  uint64_t in_flight_bytes_ = 0;
  std::vector<std::vector<PartCrc>> early_crcs_;
};

struct KvStreamSendResult {
  Status status;
  bool refused = false;  // the receiver refused the handshake (identities differ): no retry helps
  uint64_t bytes_sent = 0;  // on the wire, frame headers and handshake included
  double seconds = 0;       // from connecting to the receiver's DONE
};
// Sends a whole transfer (an export_kv result) a layer at a time, with `request` beside it.
KvStreamSendResult send_kv_transfer(const std::string& address, const KvStreamIdentity& identity,
                                    std::span<const uint8_t> transfer, const KvStreamRequest& request,
                                    const KvStreamSendOptions& options);

// --- the receiver ---

struct ReceivedKv {
  KvStreamRequest request;
  std::vector<uint8_t> transfer;  // the sender's transfer, byte for byte, checked (CRC, structure)
  // The CRC32C of the transfer that arrived, before its trailer, joined from the frames' as they landed:
  // an import of `transfer` compares it with the trailer instead of reading every byte again
  // (Engine::import_kv's received_crc); a staged store's export has it too. Absent for KV that came in
  // GPU memory.
  std::optional<uint32_t> received_crc = std::nullopt;
  // Instead of transfer, with KvStreamReceiverOptions::staging (a staged import, engine/kv_staging.h):
  // the KV already placed as it arrived, the whole transfer checked as transfer is: on the CPU restored
  // into a store of the receiving engine (Engine::adopt_kv takes it), on the GPU as device_kv.
  std::shared_ptr<KvStore> staged_kv = nullptr;
  // Instead of transfer, over CUDA IPC or NCCL, or staged on the GPU: the KV with its sealed blocks in
  // this process's GPU memory (its open tokens' transfer checked as transfer is).
  std::shared_ptr<const DeviceKvTransfer> device_kv = nullptr;
  // A staged stream's blocks held in the receiving engine's KV budget until its request imports it.
  std::shared_ptr<KvReservation> kv_reservation = nullptr;
  uint64_t wire_bytes = 0;
  uint64_t kv_bytes() const;  // what it holds, in host and GPU memory
};

struct KvStreamReceiverOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (port() says which)
  std::chrono::milliseconds io_timeout{30000};  // per frame
  // Between the handshake and the KV head the sender prefills the prompt: a longer wait.
  std::chrono::milliseconds head_timeout{600000};
  // A stream that arrived but that no request claims (wait_for) within this time is dropped; and while
  // the unclaimed streams hold more than max_unclaimed_bytes, the oldest are dropped (a stream whose
  // request waits for it is claimed at once and never dropped).
  std::chrono::milliseconds keep_unclaimed{120000};
  uint64_t max_unclaimed_bytes = uint64_t(1) << 30;
  // A stream's tokens a layer at most (the decode worker's context): bounds the KV_BLOCKS buffered
  // before the KV_HEAD, and what a head may declare (the transfer is allocated from it).
  int max_tokens = 1 << 20;
  int max_connections = 64;  // streams received at once; more are refused
  // cuda_ipc_device_id() of a receiver whose KV lives in GPU memory: accepts the CUDA IPC path from a
  // sender on the same GPU; "": every stream comes over TCP.
  std::string cuda_ipc_device{};
  // Accepts the NCCL path (its KV lives in GPU memory and NCCL can be used here: nccl_available()).
  bool nccl = false;
  // The visible GPU the KV of the device paths lands in (`--device cuda:N`'s N): the receiving threads
  // make it theirs before any CUDA call.
  int gpu = 0;
  // Where each stream's transfer is assembled: a buffer of an earlier transfer, given back by whoever
  // imports it (the worker's scheduler) or by the receiver when the stream fails; idle buffers are freed
  // from the accept loop. nullptr: a new buffer per stream.
  std::shared_ptr<BufferPool> buffers = nullptr;
  // A staged import per stream, made once its head has arrived (Engine::new_kv_staging, called on the
  // stream's thread with the head and the stream's name; engine/kv_staging.h): each piece of a layer's
  // frame is restored into its store as soon as it has landed and been checksummed (still in cache),
  // and each complete layer placed (on the GPU: uploaded), while later layers are still on the wire,
  // with no buffer of the whole transfer (`buffers` is not used); the stream is handed over as
  // ReceivedKv::staged_kv or device_kv with its kv_reservation, checked end to end as a whole transfer
  // is. A stream that fails frees what it staged and its reservation; one whose staging is refused (no
  // room in the budget) fails naming why. nullptr: the transfer is handed over whole
  // (ReceivedKv::transfer) and imported after it arrived.
  // `reserved`: what `reserve` gave at HELLO (or nullptr), for the staging to take over.
  std::function<Expected<std::unique_ptr<KvStaging>>(const KvTransferInfo& info, std::string_view source,
                                                     std::shared_ptr<KvReservation> reserved)>
      staging = nullptr;
  // With staging: a stream whose HELLO announces the tokens its KV will hold (total_tokens: a prefill
  // worker knows them before it prefills) has their blocks reserved at once (Engine::reserve_kv), for
  // the whole prefill, instead of from its head on; when they do not fit yet, they are reserved at the
  // head (or the stream refused there, by `staging`).
  std::function<Expected<std::shared_ptr<KvReservation>>(int64_t tokens, std::string_view source)> reserve = nullptr;
  // With staging: the head of the transfer this receiver's KV would hold for `tokens` tokens a layer
  // (Engine::kv_transfer_head). A stream whose HELLO announces its tokens (and, with reserve, has them
  // reserved then) is laid out at once: its staging made from that head, its KV_BLOCKS restored into the staging as they
  // land instead of waiting in buffers for the KV_HEAD (a GPU prefill sends nearly all of its KV so),
  // and its KV_HEAD refused unless it is that head byte for byte. nullptr: staged from the KV_HEAD on.
  std::function<Expected<std::vector<uint8_t>>(int64_t tokens)> expected_head = nullptr;
};

// Whether this process can make NCCL links (a build with NCCL's header, the CUDA plugin, libnccl.so.2);
// the error says what is missing.
Status nccl_available();

// Listens for streams on a thread of its own, one thread per connection; completed streams wait in a
// mailbox, by request id, for the request that claims them.
class KvStreamReceiver {
 public:
  static Expected<std::unique_ptr<KvStreamReceiver>> start(const KvStreamIdentity& identity,
                                                           const KvStreamReceiverOptions& options);
  ~KvStreamReceiver();  // stop()
  int port() const { return port_; }

  // Waits up to `timeout` for the stream tagged `request_id` to have arrived whole, and takes it.
  Expected<ReceivedKv> wait_for(const std::string& request_id, std::chrono::milliseconds timeout);
  // Stops listening, fails the streams in progress and joins every thread. Idempotent.
  void stop();

  struct Stats {
    int unclaimed_streams = 0;     // complete, waiting for their request
    uint64_t unclaimed_bytes = 0;  // their transfers' bytes
    uint64_t dropped_age_total = 0;    // dropped after keep_unclaimed
    uint64_t dropped_bytes_total = 0;  // dropped, oldest first, to stay within max_unclaimed_bytes
    int streams_in_progress = 0;       // connections whose receiving thread has not finished
  };
  Stats stats();

 private:
  KvStreamReceiver(const KvStreamIdentity& identity, const KvStreamReceiverOptions& options, TcpListener listener);
  void accept_loop();
  void receive(TcpConnection connection);
  // Receives one stream; `serial` is set (> 0) once it holds the slot of its request id. `timing` gets
  // where its time went (DONE carries it to the sender): seconds from HELLO to the KV checked, of them
  // until the KV_HEAD (the prefill's span, its early blocks arriving), and placing the early blocks
  // after the head (work that did not overlap the prefill).
  Status receive_stream(TcpConnection& connection, ReceivedKv& received, uint64_t& serial, nlohmann::json& timing);
  // What HELLO offers of the NCCL path, taken: the link (joined) to receive over, nullptr when not
  // taken; `answer` is ACCEPT's "nccl" (false, or the link's id). `join` is set when the link must be
  // joined after the ACCEPT (it is new).
  std::shared_ptr<NcclPeerLink> take_nccl_offer(const nlohmann::json& offer, nlohmann::json& answer, bool& join);
  // After an ACCEPT of a device path: the KV_DEVICE frame, its blocks copied out of the sender's memory
  // (CUDA IPC) or received through `nccl`; the tokens per layer it holds.
  Expected<int> receive_device(TcpConnection& connection, ReceivedKv& received, const std::string& where,
                               const std::shared_ptr<NcclPeerLink>& nccl);
  // The stream's FINISH: the transfer's trailer (into `trailer`) and the request.
  Status receive_finish(TcpConnection& connection, ReceivedKv& received, uint8_t* trailer, const std::string& where);
  void drop_stale_locked();
  // Drops the oldest unclaimed complete streams nobody waits for while they hold more than the bound.
  void bound_unclaimed_locked();

  const KvStreamIdentity identity_;
  const KvStreamReceiverOptions options_;
  TcpListener listener_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> streams_in_progress_{0};
  std::thread acceptor_;
  NcclLinks nccl_links_;  // by link id (hex)

  struct Slot {
    uint64_t serial = 0;         // the latest stream whose HELLO arrived for the id
    bool complete = false;
    ReceivedKv received;         // when complete
    SteadyClock::time_point since;
  };
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::string, Slot> slots_;
  std::map<std::string, int> waiters_;  // request id -> wait_for calls waiting for it
  uint64_t next_serial_ = 1;
  uint64_t dropped_age_total_ = 0, dropped_bytes_total_ = 0;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Worker> workers_;
};

}  // namespace slimkv
