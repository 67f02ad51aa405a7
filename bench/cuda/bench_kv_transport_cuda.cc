// Disaggregated serving's KV transfer (issues 23/24; docs/kv_stream_protocol.md): one prompt's KV moved
// from a prefill process's GPU KV cache into a decode process's, per KV spec and prompt length, by each
// transport:
//   cuda_ipc   the KV stream's CUDA IPC path (one GPU): sealed blocks device → device, never in host memory
//   nccl       the KV stream's NCCL path (--two-gpus: the decode process on cuda:1, both GPUs visible to both): sealed
//              blocks sent GPU → GPU through the processes' NCCL link (NVLink where there is one)
//   nccl@N     the same paced at N Gbit/s (a link of that speed)
//   tcp        the KV stream over loopback TCP: exported to host memory, sent, received, imported
//   tcp@N      the same through the stream's token bucket at N Gbit/s
//   tcp_staged, tcp_staged@N   the same, the decode side staging the stream as it lands (a GPU decode
//              worker's import, engine/kv_staging.h): each layer uploaded into GPU memory on a stream
//              of its own as its frame arrives, so that its import (at the request's join, on the
//              scheduler's thread) is a device-to-device copy; beside tcp, the import column is the
//              time a join holds the scheduler's thread before and after
// Each row: the KV's bytes, the time of each part — export (the GPU cache → what is sent), stream
// (connecting to the receiver's DONE: the KV is in the decode process's memory), import (into its GPU
// cache) — their sum, and the sum's ratio to the first transport's (median of --repeats). The decode
// process is this binary started again (--decode-side): two processes, as the two workers are. The
// NCCL link is joined by the first nccl transfer and kept (its join time is printed once).
// The KV is random FP16 K/V of the model's shape, written through the cache's own append (sealing
// included): a transfer does not depend on weights, so none are loaded. After every import the decode
// side's KV must be the prefill side's: each side copies its sequence's sealed blocks out of its paged
// cache (export_to_device, in the transfer's order) and checksums them on its GPU
// (backend/cuda/device_checksum.h), with the CRC32C of the few open tokens' transfer beside it; the two
// are compared. (A host export for the check took ~17 s per transfer of a 64K-token dense prompt.)
//   bench_kv_transport_cuda --shape llama3-8b --specs "dense;hack:bits=4;hack:bits=2,pi=64"
//                           --prompt-tokens 16384,32768,65536 --transports cuda_ipc,tcp,tcp@100,tcp@10 --repeats 3
//   bench_kv_transport_cuda --two-gpus --transports nccl,nccl@100,nccl@10,tcp ...
//   bench_kv_transport_cuda --specs "dense;hack:bits=2,pi=64" --prompt-tokens 16384 --transports tcp,tcp_staged,tcp@10,tcp_staged@10
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cuda/device_checksum.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/random_fill.h"
#include "bench_errors.h"
#include "engine/cuda/gpu_kv_staging.h"
#include "kv/cuda/gpu_kv_plan.h"
#include "kv/cuda/gpu_kv_transfer.h"
#include "kv/transfer.h"
#include "random_shapes.h"
#include "transfer/kv_stream.h"

extern char** environ;

namespace slimkv::cuda {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Options {
  std::string shape = "llama3-8b";
  std::vector<std::string> specs = {"dense", "hack:bits=4", "hack:bits=2,pi=64"};
  std::vector<int> prompt_tokens = {16384, 32768};
  std::vector<std::string> transports = {"cuda_ipc", "tcp", "tcp@100", "tcp@10"};
  int repeats = 3;
  int step_tokens = 4096;
  bool two_gpus = false;  // the decode process on the second GPU
  // The decode side's.
  bool decode_side = false;
  bool staged = false;  // its streams staged as they land (the tcp_staged transports)
  std::string spec;
  int gpu = 0;  // its visible GPU (--two-gpus: 1)
};

// One side's GPU KV cache of the shape and spec, with what its transfers need.
struct Side {
  std::unique_ptr<GpuKvCache> cache;
  GpuKvTransferContext context;
  KvStreamIdentity identity;
};

Expected<Side> make_side(const ModelConfig& model, const std::string& spec, int context_tokens, int step_tokens) {
  SLIMKV_ASSIGN_OR_RETURN(const KvPipeline pipeline, make_kv_pipeline(spec));
  SLIMKV_ASSIGN_OR_RETURN(GpuKvPlan plan, plan_gpu_kv(pipeline, spec, int(model.hidden_size), int(model.kv_dim())));
  const GpuKvShape shape{.num_layers = int(model.num_layers), .num_heads = int(model.num_heads),
                         .num_kv_heads = int(model.num_kv_heads), .head_dim = int(model.head_dim),
                         .hidden = int(model.hidden_size), .x_dtype = DType::kF16, .max_sequences = 1,
                         .max_step_tokens = step_tokens, .context_tokens = context_tokens};
  Side side{.cache = nullptr,
            .context = {.shape = KvShape(shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.head_dim, context_tokens),
                        .pipeline = plan.pipeline,
                        .model_id = "random " + model.architecture_name},
            .identity = {}};
  SLIMKV_ASSIGN_OR_RETURN(side.cache, make_gpu_kv_cache(shape, plan.options, nullptr));
  KvStore empty(side.context.shape, side.context.pipeline);
  std::vector<uint8_t> transfer;
  SLIMKV_RETURN_IF_ERROR(write_kv_transfer(empty, side.context.model_id, transfer));
  SLIMKV_ASSIGN_OR_RETURN(side.identity, transfer_kv_identity(transfer));
  return side;
}

// `tokens` tokens of random K/V appended to a new sequence, as a prefill's steps append them.
Expected<int> fill_sequence(GpuKvCache& cache, const ModelConfig& model, int tokens, int step_tokens) {
  SLIMKV_ASSIGN_OR_RETURN(const int sequence, cache.add_sequence());
  const size_t row = size_t(model.kv_dim());
  SLIMKV_ASSIGN_OR_RETURN(auto k, DeviceArray<uint16_t>::allocate(size_t(step_tokens) * row, "random keys"));
  SLIMKV_ASSIGN_OR_RETURN(auto v, DeviceArray<uint16_t>::allocate(size_t(step_tokens) * row, "random values"));
  for (int done = 0; done < tokens; done += step_tokens) {
    const int n = std::min(step_tokens, tokens - done);
    SLIMKV_RETURN_IF_ERROR(cache.begin_fill(sequence, n));
    for (int l = 0; l < int(model.num_layers); ++l) {
      const uint64_t seed = uint64_t(done) * 1000003u + uint64_t(l) * 2;
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(k.data(), size_t(n) * row, seed, 1.732f));
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(v.data(), size_t(n) * row, seed + 1, 1.732f));
      SLIMKV_RETURN_IF_ERROR(cache.fill(l, k.data(), v.data(), nullptr));
    }
  }
  SLIMKV_RETURN_IF_ERROR(device_synchronize("filling random KV"));
  return sequence;
}

// What both sides compare: the checksum of a sequence's sealed blocks, read out of the paged cache in
// the transfer's order on the GPU, and the CRC32C of its open tokens' transfer.
struct KvChecksum {
  uint64_t sealed = 0;
  uint32_t open = 0;
  bool operator==(const KvChecksum&) const = default;
};

Expected<KvChecksum> kv_checksum(const Side& side, int sequence) {
  DeviceKvTransfer kv;
  SLIMKV_RETURN_IF_ERROR(export_to_device(*side.cache, sequence, side.context, kv));
  SLIMKV_ASSIGN_OR_RETURN(const uint64_t sealed, device_checksum(kv.pages.get(), kv.pages_bytes()));
  return KvChecksum{sealed, crc32c(kv.open.data(), kv.open.size())};
}

// --- The decode side: a receiver; for each request id read on stdin, the stream's KV imported ---
// Answers on stdout, one line each: "port P" once, then "ID IMPORT_SECONDS SEALED_CHECKSUM OPEN_CRC"
// (or "ID error MESSAGE").
int run_decode_side(const Options& o, const ModelConfig& model) {
  if (failed(use_gpu(o.gpu))) return 1;  // before the cache allocates; the receiver's threads are told too
  const int context = *std::max_element(o.prompt_tokens.begin(), o.prompt_tokens.end());
  Expected<Side> side = make_side(model, o.spec, context, o.step_tokens);
  if (failed(side.status())) return 1;
  KvStreamReceiverOptions options{.port = 0, .max_unclaimed_bytes = uint64_t(1) << 40, .max_tokens = context,
                                  .cuda_ipc_device = cuda_ipc_device_id(o.gpu), .nccl = nccl_available().is_ok(), .gpu = o.gpu};
  const auto pinned = ReusedArrays<PinnedArray<uint8_t>>::create();  // the staged layers' pinned memory, reused
  if (o.staged) {
    options.staging = [&](const KvTransferInfo& info, std::string_view source,
                          std::shared_ptr<KvReservation>) -> Expected<std::unique_ptr<KvStaging>> {
      SLIMKV_RETURN_IF_ERROR(use_gpu(o.gpu));
      return new_gpu_kv_staging(info, source, side->context.model_id, side->context.shape, side->context.pipeline,
                                side->cache->device_page_layout(), *pinned);
    };
  }
  auto receiver = KvStreamReceiver::start(side->identity, options);
  if (failed(receiver.status())) return 1;
  std::printf("port %d\n", (*receiver)->port());
  std::fflush(stdout);
  std::string id;
  while (std::cin >> id && id != "quit") {
    const auto answer = [&](const Status& status, double seconds, KvChecksum checksum) {
      if (status) std::printf("%s %.6f %llu %u\n", id.c_str(), seconds, static_cast<unsigned long long>(checksum.sealed), checksum.open);
      else std::printf("%s error %s\n", id.c_str(), status.message().c_str());
      std::fflush(stdout);
    };
    Expected<ReceivedKv> received = (*receiver)->wait_for(id, std::chrono::seconds(120));
    if (!received) {
      answer(received.status(), 0, {});
      continue;
    }
    Expected<int> sequence = side->cache->add_sequence();
    if (!sequence) {
      answer(sequence.status(), 0, {});
      continue;
    }
    const Clock::time_point start = Clock::now();
    Status imported = received->device_kv
                          ? import_from_device(*side->cache, *sequence, side->context, *received->device_kv, id)
                          : import_transfer(*side->cache, *sequence, side->context, received->transfer, id);
    if (imported) imported = device_synchronize("importing KV");
    const double seconds = seconds_since(start);
    *received = ReceivedKv{};  // frees the received KV before the next arrives
    Expected<KvChecksum> checksum = imported ? kv_checksum(*side, *sequence) : Expected<KvChecksum>(imported);
    side->cache->remove_sequence(*sequence);
    answer(checksum.status(), seconds, checksum ? *checksum : KvChecksum{});
  }
  return 0;
}

// --- The prefill side ---

// The decode side as a child process: its stdin to write ids to, its stdout to read answers from.
struct DecodeSide {
  pid_t pid = -1;
  FILE* to = nullptr;
  FILE* from = nullptr;
  int port = 0;
  std::string read_line() {
    char line[4096];
    return std::fgets(line, sizeof(line), from) ? std::string(line) : std::string();
  }
};

Expected<DecodeSide> start_decode_side(const Options& o, const std::string& spec, bool staged) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return error("pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  posix_spawn_file_actions_addclose(&actions, to_child[1]);
  posix_spawn_file_actions_addclose(&actions, from_child[0]);
  std::string tokens;
  for (int n : o.prompt_tokens) tokens += (tokens.empty() ? "" : ",") + std::to_string(n);
  std::vector<std::string> args = {std::filesystem::read_symlink("/proc/self/exe").string(), "--decode-side", "--spec", spec,
                                   "--shape", o.shape, "--prompt-tokens", tokens, "--step-tokens",
                                   std::to_string(o.step_tokens), "--gpu", o.two_gpus ? "1" : "0"};
  if (staged) args.push_back("--staged");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  DecodeSide side;
  const int spawned = posix_spawn(&side.pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  if (spawned != 0) return error("starting the decode side: ", std::strerror(spawned));
  side.to = fdopen(to_child[1], "w");
  side.from = fdopen(from_child[0], "r");
  const std::string first = side.read_line();
  if (std::sscanf(first.c_str(), "port %d", &side.port) != 1) return error("the decode side did not start: '", first, "'");
  return side;
}

int stop_decode_side(DecodeSide& side) {
  std::fprintf(side.to, "quit\n");
  std::fclose(side.to);
  std::fclose(side.from);
  int status = 0;
  waitpid(side.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

struct Timing {
  double export_s = 0, stream_s = 0, import_s = 0;
  double total() const { return export_s + stream_s + import_s; }
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

bool is_staged(const std::string& transport) { return transport.starts_with("tcp_staged"); }

// One transfer of the sequence by `transport`; the decode side's import and CRC check.
Status transfer_once(const Side& side, int sequence, const std::string& transport, int tokens, DecodeSide& decode,
                     NcclLinks& links, const std::string& id, const KvChecksum& want, Timing& timing, uint64_t& moved_bytes) {
  const std::string address = "127.0.0.1:" + std::to_string(decode.port);
  std::vector<int32_t> prompt(size_t(tokens), 1);
  const KvStreamRequest request{.request_id = id, .attempt = 0, .prompt_token_ids = prompt, .resume_token_ids = {},
                                .next_token = 1, .endpoint = "/v1/completions", .request = nlohmann::json::object()};
  Clock::time_point start = Clock::now();
  double gbps = 0;
  const bool nccl = transport == "nccl" || std::sscanf(transport.c_str(), "nccl@%lf", &gbps) == 1;
  if (transport == "cuda_ipc" || nccl) {
    auto kv = std::make_shared<DeviceKvTransfer>();
    SLIMKV_RETURN_IF_ERROR(export_to_device(*side.cache, sequence, side.context, *kv));
    timing.export_s = seconds_since(start);
    moved_bytes = kv->pages_bytes() + kv->open.size();
    start = Clock::now();
    bool refused = false;
    const bool joined = links.size() > 0;
    KvStreamSendOptions options{.bandwidth_gbps = gbps};
    if (nccl) options.nccl_links = &links;
    else options.cuda_ipc_device = cuda_ipc_device_id(0);
    SLIMKV_ASSIGN_OR_RETURN(auto sender, KvStreamSender::open(address, side.identity, id, 0, options, &refused));
    if (nccl && !sender->nccl()) return error("the decode side did not accept NCCL (is it on another GPU, with NCCL?)");
    if (!nccl && !sender->cuda_ipc()) return error("the decode side did not accept CUDA IPC (is it on this GPU?)");
    if (nccl && !joined) std::printf("(NCCL link joined in %.1f ms)\n", seconds_since(start) * 1e3);
    SLIMKV_RETURN_IF_ERROR(sender->send_device(std::move(kv)));
    SLIMKV_RETURN_IF_ERROR(sender->finish(request));
    timing.stream_s = seconds_since(start);
  } else {
    // tcp_staged sends as tcp does: the decode side (started --staged) differs.
    const std::string sent_as = is_staged(transport) ? "tcp" + transport.substr(std::string_view("tcp_staged").size()) : transport;
    if (sent_as != "tcp" && std::sscanf(sent_as.c_str(), "tcp@%lf", &gbps) != 1) {
      return error("--transports: '", transport, "' is not cuda_ipc, nccl, nccl@GBPS, tcp, tcp@GBPS, tcp_staged or tcp_staged@GBPS");
    }
    std::vector<uint8_t> transfer;
    SLIMKV_RETURN_IF_ERROR(export_transfer(*side.cache, sequence, side.context, transfer));
    timing.export_s = seconds_since(start);
    moved_bytes = transfer.size();
    const KvStreamSendResult sent = send_kv_transfer(address, side.identity, transfer, request, {.bandwidth_gbps = gbps});
    SLIMKV_RETURN_IF_ERROR(sent.status);
    timing.stream_s = sent.seconds;
  }
  std::fprintf(decode.to, "%s\n", id.c_str());
  std::fflush(decode.to);
  const std::string answer = decode.read_line();
  char answered_id[256] = {0};
  double import_s = 0;
  unsigned long long sealed = 0;
  unsigned open = 0;
  if (std::sscanf(answer.c_str(), "%255s %lf %llu %u", answered_id, &import_s, &sealed, &open) != 4 || answered_id != id) {
    return error("the decode side answered '", answer, "' for ", id);
  }
  if (KvChecksum{sealed, open} != want) {
    return error(id, ": the decode side's KV (sealed blocks' checksum ", sealed, ", open tokens' CRC ", open,
                 ") is not the prefill side's (", want.sealed, ", ", want.open, ")");
  }
  timing.import_s = import_s;
  return Status::ok();
}

int run_prefill_side(const Options& o, const ModelConfig& model) {
  const int context = *std::max_element(o.prompt_tokens.begin(), o.prompt_tokens.end());
  std::printf("KV transfer between two processes %s, %s shape (%d layers, %d KV heads of %d), random KV;\n"
              "export: GPU cache -> what is sent; stream: connect -> DONE (KV in the decode process's memory); "
              "import: into its GPU cache. Median of %d.\n\n",
              o.two_gpus ? "on two GPUs" : "of one GPU", o.shape.c_str(), int(model.num_layers), int(model.num_kv_heads),
              int(model.head_dim), o.repeats);
  std::printf("%-32s %7s %-9s %10s %10s %10s %10s %10s %8s %9s\n", "spec", "tokens", "transport", "KV MB", "export ms",
              "stream ms", "import ms", "total ms", "GB/s", ("vs " + o.transports.front()).c_str());
  int serial = 0;
  for (const std::string& spec : o.specs) {
    Expected<Side> side = make_side(model, spec, context, o.step_tokens);
    if (failed(side.status())) return 1;
    // A decode process for the transports that stage as the stream lands, and one for the others.
    DecodeSide decode_sides[2];
    for (const bool staged : {false, true}) {
      if (std::none_of(o.transports.begin(), o.transports.end(), [&](const std::string& t) { return is_staged(t) == staged; })) {
        continue;
      }
      Expected<DecodeSide> decode = start_decode_side(o, spec, staged);
      if (failed(decode.status())) return 1;
      decode_sides[staged] = *decode;
    }
    NcclLinks links;  // to this decode process
    for (const int tokens : o.prompt_tokens) {
      Expected<int> sequence = fill_sequence(*side->cache, model, tokens, o.step_tokens);
      if (failed(sequence.status())) return 1;
      Expected<KvChecksum> want = kv_checksum(*side, *sequence);
      if (failed(want.status())) return 1;
      double base_total = 0;
      for (const std::string& transport : o.transports) {
        std::vector<double> exports, streams, imports, totals;
        uint64_t moved = 0;
        for (int r = 0; r < o.repeats; ++r) {
          Timing timing;
          const Status done = transfer_once(*side, *sequence, transport, tokens, decode_sides[is_staged(transport)], links,
                                            "t" + std::to_string(serial++), *want, timing, moved);
          if (failed(done)) return 1;
          exports.push_back(timing.export_s);
          streams.push_back(timing.stream_s);
          imports.push_back(timing.import_s);
          totals.push_back(timing.total());
        }
        const double total = median(totals);
        if (base_total == 0) base_total = total;
        std::printf("%-32s %7d %-9s %10.1f %10.2f %10.2f %10.2f %10.2f %8.2f %8.2fx\n",
                    side->context.pipeline.describe().c_str(), tokens, transport.c_str(), double(moved) / 1e6,
                    median(exports) * 1e3, median(streams) * 1e3, median(imports) * 1e3, total * 1e3,
                    double(moved) / median(streams) / 1e9, total / base_total);
        std::fflush(stdout);
      }
      side->cache->remove_sequence(*sequence);
    }
    for (DecodeSide& decode : decode_sides) {
      if (decode.pid >= 0 && stop_decode_side(decode) != 0) {
        std::fprintf(stderr, "error: the decode side of %s failed\n", spec.c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) {
  using namespace slimkv::cuda;
  CLI::App app("KV transfer between a prefill and a decode process: CUDA IPC (one GPU) or NCCL (two GPUs) vs TCP (capped or not)");
  Options o;
  app.add_option("--shape", o.shape, "model shape: llama3-8b, llama2-7b")->capture_default_str();
  app.add_option("--specs", o.specs, "KV specs, ';'-separated")->delimiter(';');
  app.add_option("--prompt-tokens", o.prompt_tokens, "prompt lengths, ','-separated")->delimiter(',');
  app.add_option("--transports", o.transports,
                 "cuda_ipc, nccl, nccl@GBPS, tcp, tcp@GBPS, tcp_staged, tcp_staged@GBPS, ','-separated (the first is the "
                 "ratios' base)")
      ->delimiter(',');
  app.add_flag("--two-gpus", o.two_gpus, "the decode process on the second GPU (for nccl; cuda_ipc needs one GPU)");
  app.add_option("--repeats", o.repeats, "transfers per row (the median is printed)")->check(CLI::Range(1, 100));
  app.add_option("--step-tokens", o.step_tokens, "tokens appended per step while filling")->check(CLI::Range(64, 1 << 16));
  app.add_flag("--decode-side", o.decode_side, "(internal) run as the decode process");
  app.add_option("--spec", o.spec, "(internal) the decode process's KV spec");
  app.add_flag("--staged", o.staged, "(internal) the decode process stages its streams as they land");
  app.add_option("--gpu", o.gpu, "(internal) the decode process's visible GPU");
  CLI11_PARSE(app, argc, argv);
  if (failed(device_usable())) return 1;
  if (o.two_gpus && failed(check_visible_gpu(1))) return 1;
  slimkv::Expected<slimkv::ModelConfig> model = random_shape(o.shape);
  if (failed(model.status())) return 1;
  return o.decode_side ? run_decode_side(o, *model) : run_prefill_side(o, *model);
}
