// The GPU's KV stream during steps (Engine::stream_sealed_kv on device cuda): each layer's newly sealed
// blocks handed out right after its attention, copied to host memory while later layers compute, then
// the head and the open tokens after the last step; what a receiver gets is the export byte for byte.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "source_dir.h"
#include "transfer/chunk_stream_check.h"

namespace slimkv::cuda {
namespace {

class KvLayerStreamCuda : public CudaTest {};

TEST_F(KvLayerStreamCuda, ChunksStreamedLayerByLayerArriveAsExported) {
  for (const std::string spec : {"dense", "hack:bits=2,pi=64", "hack:bits=4"}) {
    SCOPED_TRACE(spec);
    test::expect_chunks_streamed_as_exported(test::source_dir() + "/models/slimkv-llama-15m", spec, "cuda");
  }
}

}  // namespace
}  // namespace slimkv::cuda
