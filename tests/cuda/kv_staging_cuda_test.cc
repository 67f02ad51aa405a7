// A GPU decode worker's staged import (engine/kv_staging.h): a KV stream's layers uploaded into GPU
// memory as their frames land, so that the request's join imports them device to device. What it
// imports is bit for bit what importing the whole transfer gives (the same KV, the same next logits);
// its blocks are reserved in the KV budget while it arrives, and a stream that breaks midway lets its
// staging and its reservation go.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "cuda_test_util.h"
#include "engine/kv_staging.h"
#include "kv/transfer.h"
#include "slimkv/engine.h"
#include "transfer/kv_stream.h"
#include "transfer/prefilled_engine.h"

namespace slimkv::cuda {
namespace {

using namespace std::chrono_literals;

class KvStagingCuda : public CudaTest {};

using test::Prefilled;
Prefilled prefill_on_gpu(const std::string& spec, int tokens) { return test::prefill_bundled(spec, tokens, "cuda", 3); }

Expected<std::unique_ptr<KvStreamReceiver>> staging_receiver(Engine& engine, const KvStreamIdentity& identity) {
  KvStreamReceiverOptions options{.port = 0, .io_timeout = 5000ms};
  options.staging = [&engine](const KvTransferInfo& info, std::string_view source, std::shared_ptr<KvReservation> reserved) {
    return engine.new_kv_staging(info, source, std::move(reserved));
  };
  options.reserve = [&engine](int64_t tokens, std::string_view source) { return engine.reserve_kv(tokens, source); };
  return KvStreamReceiver::start(identity, options);
}

std::string loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

TEST_F(KvStagingCuda, AStagedStreamImportsWhatAWholeImportGives) {
  // 300 tokens: 4 sealed blocks of 64 and 44 open tokens in every layer.
  for (const std::string spec : {"dense", "hack:bits=2,pi=64", "hack:bits=4"}) {
    SCOPED_TRACE(spec);
    Prefilled p = prefill_on_gpu(spec, 300);
    ASSERT_TRUE(p.engine);
    ASSERT_TRUE(p.engine->stages_kv());
    auto receiver = staging_receiver(*p.engine, p.identity);
    ASSERT_TRUE(receiver) << receiver.status().message();
    const KvStreamRequest request{.request_id = "g1", .attempt = 0, .prompt_token_ids = p.prompt, .resume_token_ids = {},
                                  .next_token = 7, .endpoint = "/v1/completions", .request = {{"prompt", "x"}}};
    const KvStreamSendResult sent = send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, request, {});
    ASSERT_TRUE(sent.status) << sent.status.message();
    Expected<ReceivedKv> got = (*receiver)->wait_for("g1", 5s);
    ASSERT_TRUE(got) << got.status().message();
    ASSERT_TRUE(got->device_kv) << "staged on the GPU: its blocks in GPU memory";
    EXPECT_TRUE(got->transfer.empty());
    EXPECT_EQ(got->device_kv->sealed_blocks, 4);
    ASSERT_TRUE(got->kv_reservation);
    EXPECT_EQ(p.engine->kv_budget().reserved_blocks, got->kv_reservation->blocks());
    EXPECT_EQ(got->kv_reservation->blocks(), p.engine->kv_budget().blocks_for_tokens(300));

    const SequenceId staged = *p.engine->add_sequence(), whole = *p.engine->add_sequence();
    const Status imported = p.engine->import_kv_from_device(staged, *got->device_kv, "the staged stream");
    ASSERT_TRUE(imported) << imported.message();
    ASSERT_TRUE(p.engine->import_kv(whole, p.transfer, "the whole transfer"));
    got->kv_reservation = nullptr;  // as the scheduler lets it go at admission
    EXPECT_EQ(p.engine->kv_budget().reserved_blocks, 0);
    EXPECT_EQ(*p.engine->export_kv(staged), p.transfer);
    EXPECT_EQ(*p.engine->export_kv(whole), p.transfer);
    const int32_t next = 7;
    const std::vector<StepItem> items = {{staged, std::span(&next, 1), StepOutput::kLastLogits},
                                         {whole, std::span(&next, 1), StepOutput::kLastLogits}};
    StepResult result;
    ASSERT_TRUE(p.engine->step(items, result));
    EXPECT_TRUE(std::equal(result.logits_of(0).begin(), result.logits_of(0).end(), result.logits_of(1).begin()));
  }
}

TEST_F(KvStagingCuda, ABrokenStreamLetsItsGpuStagingAndReservationGo) {
  Prefilled p = prefill_on_gpu("dense", 300);
  ASSERT_TRUE(p.engine);
  auto receiver = staging_receiver(*p.engine, p.identity);
  ASSERT_TRUE(receiver) << receiver.status().message();
  const KvTransferInfo info = *inspect_kv_transfer(p.transfer.data(), p.transfer.size(), "t");
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(info);
  const auto reserved_becomes = [&](int64_t blocks) {
    for (int i = 0; i < 300 && p.engine->kv_budget().reserved_blocks != blocks; ++i) std::this_thread::sleep_for(10ms);
    return p.engine->kv_budget().reserved_blocks == blocks;
  };
  {
    bool refused = false;
    auto sender = KvStreamSender::open(loopback((*receiver)->port()), p.identity, "g2", 0, {}, &refused);
    ASSERT_TRUE(sender) << sender.status().message();
    ASSERT_TRUE((*sender)->send_head(std::span<const uint8_t>(p.transfer).first(info.sealed_offset)));
    const KvTransferLayerRanges& layer0 = ranges[0];
    ASSERT_TRUE((*sender)->send_layer(0, 0, std::span<const uint8_t>(p.transfer).subspan(layer0.sealed_offset, layer0.sealed_bytes),
                                      std::span<const uint8_t>(p.transfer).subspan(layer0.open_offset, layer0.open_bytes)));
    // Layer 0 is uploaded (or on its way) and the blocks reserved while the sender computes the rest.
    EXPECT_TRUE(reserved_becomes(p.engine->kv_budget().blocks_for_tokens(300)));
  }  // the sender dies
  EXPECT_TRUE(reserved_becomes(0));
  for (int i = 0; i < 300 && (*receiver)->stats().streams_in_progress > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ((*receiver)->stats().streams_in_progress, 0);
  EXPECT_FALSE((*receiver)->wait_for("g2", 50ms));
  // The engine takes the next stream as if nothing had happened.
  const KvStreamRequest request{.request_id = "g3", .attempt = 0, .prompt_token_ids = p.prompt, .resume_token_ids = {},
                                .next_token = 7, .endpoint = "/v1/completions", .request = {{"prompt", "x"}}};
  ASSERT_TRUE(send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, request, {}).status);
  Expected<ReceivedKv> got = (*receiver)->wait_for("g3", 5s);
  ASSERT_TRUE(got && got->device_kv) << (got ? "no device KV" : got.status().message());
}

}  // namespace
}  // namespace slimkv::cuda
