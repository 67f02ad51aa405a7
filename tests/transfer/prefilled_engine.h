// An engine of the bundled model on `device` holding one sequence of `tokens` prompt tokens, and that
// sequence's export: the sending side of the KV stream tests, the CPU's and the GPU's.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "slimkv/engine.h"
#include "source_dir.h"
#include "transfer/kv_stream.h"

namespace slimkv::test {

struct Prefilled {
  std::unique_ptr<Engine> engine;
  KvStreamIdentity identity;
  std::vector<int32_t> prompt;
  std::vector<uint8_t> transfer;
};

inline Prefilled prefill_bundled(const std::string& spec, int tokens, const std::string& device, int max_sequences) {
  Prefilled out;
  auto engine = Engine::load({.model_dir = source_dir() + "/models/slimkv-llama-15m", .kv_spec = spec, .device = device,
                              .threads = 2, .max_sequences = max_sequences});
  EXPECT_TRUE(engine) << engine.status().message();
  if (!engine) return out;
  out.engine = engine.take();
  Expected<KvStreamIdentity> identity = engine_kv_identity(*out.engine);
  EXPECT_TRUE(identity) << identity.status().message();
  if (identity) out.identity = *identity;
  for (int i = 0; i < tokens; ++i) out.prompt.push_back(int32_t(5 + (i * 37) % 900));
  auto session = out.engine->new_session();
  EXPECT_TRUE(session->prefill(out.prompt));
  out.transfer = *out.engine->export_kv(session->sequence());
  return out;
}

}  // namespace slimkv::test
