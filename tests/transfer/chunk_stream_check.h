// A prompt prefilled in chunks (Engine::stream_sealed_kv, then stream_kv_in_next_step for the last) on
// `device`: the blocks each step seals go out as KV_BLOCKS while later chunks (and, on the GPU, later
// layers) are still to come, the last step's pieces carry only the rest, and the receiver's transfer is
// the export byte for byte (and staged as it arrives, on either device); a recomputed prompt (a
// preemption) that hands out the same blocks again has them skipped by the sender. Shared by the CPU's
// KV stream tests and the GPU's.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "kv/transfer.h"
#include "slimkv/engine.h"
#include "transfer/kv_stream.h"

namespace slimkv::test {

inline void expect_chunks_streamed_as_exported(const std::string& model_dir, const std::string& spec, const std::string& device) {
  using namespace std::chrono_literals;
  auto engine = Engine::load({.model_dir = model_dir, .kv_spec = spec, .device = device, .threads = 2, .max_sequences = 2});
  ASSERT_TRUE(engine) << engine.status().message();
  const KvStreamIdentity identity = *engine_kv_identity(**engine);
  const SequenceId sequence = *(*engine)->add_sequence();
  std::vector<int32_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(int32_t(11 + (i * 53) % 800));
  std::vector<KvTransferPiece> pieces;
  const KvPieceCallback keep = [&](KvTransferPiece piece) { pieces.push_back(std::move(piece)); };
  size_t done = 0;
  for (const size_t chunk : {size_t(100), size_t(100), size_t(100)}) {  // 64-token blocks: 1, 3, then 4 sealed
    const bool last = done + chunk == tokens.size();
    ASSERT_TRUE(last ? (*engine)->stream_kv_in_next_step(sequence, keep) : (*engine)->stream_sealed_kv(sequence, keep));
    const StepItem item{sequence, std::span<const int32_t>(tokens).subspan(done, chunk),
                        last ? StepOutput::kSample : StepOutput::kNone};
    StepResult result;
    ASSERT_TRUE((*engine)->step({&item, 1}, result));
    done += chunk;
  }
  // The CPU hands out the last step's blocks with each layer's rest; the GPU hands out every step's
  // blocks layer by layer as they are sealed, and the open tokens after the last step.
  const int layers = identity.num_layers;
  const bool cpu = device == "cpu";
  const std::vector<int> early_first_blocks = cpu ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 3};
  const size_t early_pieces = early_first_blocks.size() * size_t(layers);
  ASSERT_EQ(pieces.size(), early_pieces + size_t(layers) + 1) << spec;
  for (size_t i = 0; i < early_pieces; ++i) {
    EXPECT_FALSE(pieces[i].final);
    EXPECT_EQ(pieces[i].layer, int(i % size_t(layers)));
    EXPECT_EQ(pieces[i].first_block, early_first_blocks[i / size_t(layers)]);
  }
  EXPECT_EQ(pieces[early_pieces].layer, -1);
  EXPECT_EQ(pieces.back().first_block, cpu ? 3 : 4);

  auto receiver = KvStreamReceiver::start(identity, {.port = 0});
  ASSERT_TRUE(receiver) << receiver.status().message();
  const auto loopback = [](int port) { return "127.0.0.1:" + std::to_string(port); };
  bool refused = false;
  auto sender = KvStreamSender::open(loopback((*receiver)->port()), identity, "c1", 0, {}, &refused);
  ASSERT_TRUE(sender) << sender.status().message();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Status sent = (*sender)->send_piece(pieces[i]);
    ASSERT_TRUE(sent) << sent.message();
    if (i == size_t(layers) - 1) {  // the first chunk's blocks again, as a recompute hands them out
      for (size_t j = 0; j < size_t(layers); ++j) {
        ASSERT_TRUE((*sender)->send_blocks(pieces[j].layer, pieces[j].first_block, pieces[j].bytes));
      }
    }
  }
  const KvStreamRequest request{.request_id = "c1", .attempt = 0, .prompt_token_ids = tokens, .resume_token_ids = {},
                                .next_token = 7, .endpoint = "/v1/completions", .request = {{"prompt", "x"}}};
  ASSERT_TRUE((*sender)->finish(request));
  Expected<ReceivedKv> got = (*receiver)->wait_for("c1", 5s);
  ASSERT_TRUE(got) << got.status().message();
  const std::vector<uint8_t> exported = *(*engine)->export_kv(sequence);
  EXPECT_EQ(got->transfer, exported) << spec;
  EXPECT_EQ(got->wire_bytes, (*sender)->bytes_sent());
  // Staged as it arrives (a decode worker's import: engine/kv_staging.h): on the CPU into a store the
  // engine adopts, on the GPU uploaded layer by layer into GPU memory, which the engine imports device
  // to device. Either holds the export's bytes: staged from the head on (the early blocks restored from
  // their frames' copies), and laid out at HELLO from the tokens it announces (the early blocks restored
  // as they land: KvStreamReceiverOptions::expected_head).
  ASSERT_TRUE((*engine)->stages_kv()) << spec;
  for (const bool at_hello : {false, true}) {
    SCOPED_TRACE(at_hello ? "laid out at HELLO" : "staged from the head");
    KvStreamReceiverOptions options{.port = 0};
    options.staging = [&](const KvTransferInfo& info, std::string_view source, std::shared_ptr<KvReservation> reserved) {
      return (*engine)->new_kv_staging(info, source, std::move(reserved));
    };
    if (at_hello) {
      options.reserve = [&](int64_t n, std::string_view source) { return (*engine)->reserve_kv(n, source); };
      options.expected_head = [&](int64_t n) { return (*engine)->kv_transfer_head(n); };
    }
    auto staging = KvStreamReceiver::start(identity, options);
    ASSERT_TRUE(staging) << staging.status().message();
    auto staged_sender = KvStreamSender::open(loopback((*staging)->port()), identity, "c1", 0,
                                              {.total_tokens = at_hello ? int64_t(tokens.size()) : 0}, &refused);
    ASSERT_TRUE(staged_sender) << staged_sender.status().message();
    for (const KvTransferPiece& piece : pieces) ASSERT_TRUE((*staged_sender)->send_piece(piece));
    ASSERT_TRUE((*staged_sender)->finish(request));
    Expected<ReceivedKv> staged = (*staging)->wait_for("c1", 5s);
    ASSERT_TRUE(staged) << staged.status().message();
    ASSERT_TRUE(staged->kv_reservation) << spec;
    EXPECT_EQ((*engine)->kv_budget().reserved_blocks, staged->kv_reservation->blocks());
    const SequenceId adopted = *(*engine)->add_sequence();
    if (cpu) {
      ASSERT_TRUE(staged->staged_kv) << spec;
      ASSERT_TRUE((*engine)->adopt_kv(adopted, staged->staged_kv, "the staged stream"));
    } else {
      ASSERT_TRUE(staged->device_kv) << spec;
      const Status imported = (*engine)->import_kv_from_device(adopted, *staged->device_kv, "the staged stream");
      ASSERT_TRUE(imported) << imported.message();
    }
    EXPECT_EQ(*(*engine)->export_kv(adopted), exported) << spec;
    staged->kv_reservation = nullptr;
    EXPECT_EQ((*engine)->kv_budget().reserved_blocks, 0) << spec;
    ASSERT_TRUE((*engine)->remove_sequence(adopted));
  }
  // A gap (blocks from 5 on, after 4 sent) is the sender's error, before any byte goes out.
  auto other = KvStreamSender::open(loopback((*receiver)->port()), identity, "c2", 0, {}, &refused);
  ASSERT_TRUE(other);
  EXPECT_FALSE((*other)->send_blocks(0, 2, pieces[0].bytes));
}

}  // namespace slimkv::test
