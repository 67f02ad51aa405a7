// The KV stream's device paths (transfer/kv_stream.h, docs/kv_stream_protocol.md "CUDA IPC" and "NCCL")
// between two processes, as a prefill and a decode worker use them: CUDA IPC on one GPU, NCCL between
// two GPUs (the prefill side then runs on the second GPU: `--device cuda:1` with both GPUs visible, or
// CUDA_VISIBLE_DEVICES=1,0 and `cuda`, the older way). This process is the decode side: it starts a
// copy of this test binary as the prefill side (KvIpcSender.*, which runs only when started so), which
// prefills a prompt, sends its KV by the device path (one KV_DEVICE frame; the sealed blocks never pass
// through host memory) and then writes its export_kv bytes and the logits of one more decode step. The
// decode side imports what arrived device to device into its paged cache; its export_kv bytes and its
// logits of the same step must equal the prefill side's, bit for bit.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cuda_test_util.h"
#include "slimkv/engine.h"
#include "transfer/kv_stream.h"
#include "source_dir.h"

extern char** environ;

namespace slimkv::cuda {
namespace {

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";
const char* const kRequestId = "kv-ipc-test";

std::unique_ptr<Engine> load(const std::string& kv, const std::string& device = "cuda") {
  return take(Engine::load({.model_dir = kBundled, .kv_spec = kv, .device = device, .threads = 2, .max_sequences = 2}));
}

std::vector<int32_t> prompt_of(int n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 13) % 4000);
  return tokens;
}

void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(data), std::streamsize(bytes));
}
std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

// One step of `tokens` with the last row's logits.
std::vector<float> step_logits(Engine& engine, SequenceId sequence, const std::vector<int32_t>& tokens) {
  StepResult out;
  const Status stepped = engine.step(std::vector<StepItem>{{sequence, tokens, StepOutput::kLastLogits}}, out);
  EXPECT_TRUE(stepped.is_ok()) << stepped.message();
  if (!stepped.is_ok()) return {};
  const std::span<const float> row = out.logits_of(0);
  return {row.begin(), row.end()};
}

// The prefill side: started by KvIpcTest with its settings in the environment.
TEST(KvIpcSender, SendsAPrefilledPromptByCudaIpc) {
  const char* address = std::getenv("SLIMKV_KV_IPC_ADDRESS");
  if (address == nullptr) GTEST_SKIP() << "the prefill process of KvIpcTest (started by it)";
  const std::string kv = std::getenv("SLIMKV_KV_IPC_KV"), out = std::getenv("SLIMKV_KV_IPC_OUT");
  const std::vector<int32_t> prompt = prompt_of(std::atoi(std::getenv("SLIMKV_KV_IPC_TOKENS")));
  const bool nccl = std::getenv("SLIMKV_KV_IPC_NCCL") != nullptr;
  std::unique_ptr<Engine> engine = load(kv, std::getenv("SLIMKV_KV_IPC_DEVICE"));
  const int gpu = engine->device().gpu;
  const KvStreamIdentity identity = take(engine_kv_identity(*engine));
  bool refused = false;
  NcclLinks links;
  std::unique_ptr<KvStreamSender> sender = take(KvStreamSender::open(
      address, identity, kRequestId, 0,
      {.cuda_ipc_device = cuda_ipc_device_id(gpu), .nccl_links = &links, .gpu = gpu, .total_tokens = int64_t(prompt.size())},
      &refused));
  if (nccl) {
    ASSERT_TRUE(sender->nccl()) << "the decode side, on another GPU, did not accept NCCL";
  } else {
    ASSERT_TRUE(sender->cuda_ipc()) << "the decode side, on this GPU, did not accept CUDA IPC";
  }

  // Over NCCL each layer's blocks go as the step seals them, then the layout and open tokens; over CUDA
  // IPC the whole KV after the step.
  const SequenceId sequence = take(engine->add_sequence());
  std::vector<KvTransferPiece> pieces;
  SLIMKV_ASSERT_OK(engine->stream_kv_in_next_step(sequence, [&](KvTransferPiece piece) { pieces.push_back(std::move(piece)); },
                                                  nccl ? KvStreamForm::kDeviceLayers : KvStreamForm::kDeviceWhole));
  const std::vector<float> prompt_logits = step_logits(*engine, sequence, prompt);
  const int blocks = int(prompt.size()) / 64;
  ASSERT_EQ(pieces.size(), size_t(nccl && blocks > 0 ? identity.num_layers + 1 : 1));
  const std::shared_ptr<const DeviceKvTransfer> device = pieces.back().device;
  ASSERT_TRUE(device) << "no KV in GPU memory after the step";
  EXPECT_EQ(device->sealed_blocks, blocks);
  EXPECT_EQ(bool(device->pages), !nccl);
  const int32_t next = int32_t(std::max_element(prompt_logits.begin(), prompt_logits.end()) - prompt_logits.begin());
  for (const KvTransferPiece& piece : pieces) SLIMKV_ASSERT_OK(sender->send_piece(piece));
  SLIMKV_ASSERT_OK(sender->finish({.request_id = kRequestId, .attempt = 0, .prompt_token_ids = prompt, .resume_token_ids = {},
                                   .next_token = next, .endpoint = "/v1/completions", .request = nlohmann::json::object()}));

  const std::vector<uint8_t> exported = take(engine->export_kv(sequence));
  write_file(out + "/export.bin", exported.data(), exported.size());
  const std::vector<float> logits = step_logits(*engine, sequence, {next});
  write_file(out + "/logits.bin", logits.data(), logits.size() * sizeof(float));
}

struct IpcCase {
  std::string kv;
  int prompt_tokens;  // 200: 3 sealed blocks + 8 open tokens; 128: blocks only; 5: open tokens only
  bool nccl = false;  // the prefill side on the second GPU: NCCL instead of CUDA IPC
  // With nccl: the prefill side's GPU chosen by CUDA_VISIBLE_DEVICES=1,0 and `cuda`, not by `cuda:1`.
  bool by_visible_devices = false;
};

class KvIpcTest : public CudaTest, public ::testing::WithParamInterface<IpcCase> {};

// Starts this binary as the prefill side; its exit status.
int run_prefill_side(const IpcCase& c, const std::string& address, const std::string& out) {
  std::vector<std::string> env_strings = {"SLIMKV_KV_IPC_ADDRESS=" + address, "SLIMKV_KV_IPC_KV=" + c.kv,
                                          "SLIMKV_KV_IPC_TOKENS=" + std::to_string(c.prompt_tokens), "SLIMKV_KV_IPC_OUT=" + out};
  // NCCL: the second GPU, the first still visible (NCCL reaches a GPU only through one it sees).
  if (c.nccl) env_strings.push_back("SLIMKV_KV_IPC_NCCL=1");
  if (c.by_visible_devices) env_strings.insert(env_strings.end(), {"CUDA_VISIBLE_DEVICES=1,0", "SLIMKV_KV_IPC_DEVICE=cuda"});
  else env_strings.push_back(c.nccl ? "SLIMKV_KV_IPC_DEVICE=cuda:1" : "SLIMKV_KV_IPC_DEVICE=cuda");
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  for (char** e = environ; *e != nullptr; ++e) {
    if (!c.by_visible_devices || std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) != 0) env.push_back(*e);
  }
  env.push_back(nullptr);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=KvIpcSender.SendsAPrefilledPromptByCudaIpc";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, env.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_P(KvIpcTest, TheDecodeSideHoldsThePrefillSidesKvBitForBit) {
  const IpcCase& c = GetParam();
  SCOPED_TRACE(str_cat("kv ", c.kv, ", ", c.prompt_tokens, " prompt tokens"));
  const std::string ipc_device = cuda_ipc_device_id(0);
  ASSERT_FALSE(ipc_device.empty());
  if (c.nccl) {
    if (const Status nccl = nccl_available(); !nccl.is_ok()) GTEST_SKIP() << nccl.message();
    if (device_count() < 2) GTEST_SKIP() << "NCCL between two GPUs: this machine has " << device_count();
  }
  std::unique_ptr<Engine> engine = load(c.kv);
  std::unique_ptr<KvStreamReceiver> receiver = take(KvStreamReceiver::start(
      take(engine_kv_identity(*engine)), {.port = 0, .cuda_ipc_device = ipc_device, .nccl = c.nccl}));
  const std::string out = ::testing::TempDir() + "/kv_ipc_" + std::to_string(getpid());
  std::filesystem::create_directories(out);

  // The receiver takes the stream on its own thread while the prefill side runs.
  const int exit_status = run_prefill_side(c, "127.0.0.1:" + std::to_string(receiver->port()), out);
  ASSERT_EQ(exit_status, 0) << "the prefill side failed (its output is above)";
  Expected<ReceivedKv> received = receiver->wait_for(kRequestId, std::chrono::seconds(10));
  ASSERT_TRUE(received.has_value()) << received.status().message();
  ASSERT_TRUE(received->device_kv) << "the KV came over TCP, not " << (c.nccl ? "NCCL" : "CUDA IPC");
  EXPECT_TRUE(received->transfer.empty());
  EXPECT_EQ(received->device_kv->sealed_blocks, c.prompt_tokens / 64);
  // Over TCP a sealed block crosses the socket; here only the open tokens and the frames do.
  EXPECT_LT(received->wire_bytes, received->device_kv->open.size() + 4096);

  const SequenceId sequence = take(engine->add_sequence());
  SLIMKV_ASSERT_OK(engine->import_kv_from_device(sequence, *received->device_kv, "the IPC test's stream"));
  const std::vector<uint8_t> exported = take(engine->export_kv(sequence));
  const std::vector<uint8_t> source = read_file(out + "/export.bin");
  ASSERT_FALSE(source.empty());
  EXPECT_TRUE(exported == source) << "export_kv after the import differs from the prefill side's (" << exported.size()
                                  << " vs " << source.size() << " bytes)";
  const std::vector<float> logits = step_logits(*engine, sequence, {received->request.next_token});
  const std::vector<uint8_t> source_logits = read_file(out + "/logits.bin");
  ASSERT_EQ(source_logits.size(), logits.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(source_logits.data(), logits.data(), source_logits.size()), 0)
      << "the next step's logits differ from the prefill side's";
  std::filesystem::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Specs, KvIpcTest,
                         ::testing::Values(IpcCase{"dense", 200}, IpcCase{"dense", 128}, IpcCase{"dense", 5},
                                           IpcCase{"hack:bits=4", 200}, IpcCase{"hack:bits=2,pi=64", 200},
                                           IpcCase{"hack:bits=2,pi=64", 128}, IpcCase{"hack:bits=2,pi=64", 5},
                                           IpcCase{"dense", 200, true}, IpcCase{"dense", 5, true},
                                           IpcCase{"hack:bits=4", 200, true}, IpcCase{"hack:bits=2,pi=64", 200, true},
                                           IpcCase{"hack:bits=2,pi=64", 128, true}, IpcCase{"dense", 200, true, true}),
                         [](const ::testing::TestParamInfo<IpcCase>& info) {
                           std::string name = info.param.kv + "_" + std::to_string(info.param.prompt_tokens) +
                                              (info.param.nccl ? "_nccl" : "") +
                                              (info.param.by_visible_devices ? "_visible_devices" : "");
                           std::replace_if(name.begin(), name.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return name;
                         });

using KvDeviceImportTest = CudaTest;

// KV in GPU memory made with another spec is refused, as a transfer of it would be.
TEST_F(KvDeviceImportTest, RefusesKvOfAnotherSpec) {
  std::unique_ptr<Engine> dense = load("dense"), hack = load("hack:bits=2,pi=64");
  const SequenceId a = take(dense->add_sequence()), b = take(hack->add_sequence());
  (void)step_logits(*dense, a, prompt_of(130));
  const DeviceKvTransfer kv = take(dense->export_kv_to_device(a));
  EXPECT_EQ(kv.sealed_blocks, 2);
  const Status refused = hack->import_kv_from_device(b, kv, "a dense engine's KV");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("spec"), std::string::npos) << refused.message();
}

}  // namespace
}  // namespace slimkv::cuda
