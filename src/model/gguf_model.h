// A GGUF file (tensor/gguf.h) as a slimkv model: its metadata as a ModelConfig and its tensors under
// the Hugging Face names the model code asks for, so `--model FILE.gguf` runs through the same
// LlamaWeights / forward pass as a safetensors directory.
//
// Both mappings are tables (gguf_model.cc): kArchitectures says, per `general.architecture`, which
// slimkv family it is and how llama.cpp's converter stored it; kConfigKeys maps the
// `{arch}.*` metadata keys to ModelConfig fields; kLayerTensors maps `blk.N.*` tensor names to
// `model.layers.N.*` (Gemma 3's sandwich norms by a table of their own; stacked experts
// blk.N.ffn_*_exps [experts, rows, cols] become one view per expert, as the Hub stores them). A
// family's own keys (experts, sliding layers) are read by the function its row names.
//
// llama.cpp's converter interleaves the rows of Q and K in each head for the `llama` architecture
// (its RoPE rotates adjacent pairs; transformers' rotates halves): those two matrices are permuted
// back at load, into owned copies (rows move whole, so quantized blocks move unchanged).
#pragma once

#include <string>

#include "model/model_config.h"
#include "model/weight_store.h"
#include "slimkv/status.h"
#include "tensor/gguf.h"

namespace slimkv {

// The config that `file`'s metadata describes; errors name the file and the key.
Expected<ModelConfig> gguf_model_config(const GgufFile& file);

struct GgufModel {
  ModelConfig config;
  WeightStore weights;  // Hugging Face names; owns the mapping
};

// Opens PATH (a GGUF file) as a model.
Expected<GgufModel> load_gguf_model(const std::string& path);

}  // namespace slimkv
