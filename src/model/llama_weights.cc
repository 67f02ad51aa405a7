#include "model/llama_weights.h"

#include "backend/cpu/vec_ops.h"
#include "tensor/finite.h"

namespace slimkv {
namespace {

// A NaN or Inf weight turns every later activation into garbage; refuse it here, naming the tensor.
// Costs one read of the weights (docs/testing.md has the measured load time with and without it).
// `cols` 0: a vector, no row/column in the message.
Status check_finite(const TensorInfo& tensor, int64_t cols) {
  if (tensor.quant != BlockQuant::kNone) {
    const int64_t block = first_non_finite_block(tensor.quant, tensor.data, tensor.num_elements());
    if (block < 0) return Status::ok();
    const int64_t element = block * block_elements(tensor.quant);
    return error(tensor.file, ": tensor '", tensor.name, "' (", block_quant_name(tensor.quant),
                 ") has a NaN or Inf scale in block ", block, " (row ", element / cols, ", columns ", element % cols,
                 " onwards): the file is broken (re-download or re-convert it)");
  }
  const size_t count = tensor.size_bytes / dtype_size_bytes(tensor.dtype);
  const int64_t bad = first_non_finite(tensor.data, tensor.dtype, count);
  if (bad < 0) return Status::ok();
  return error(tensor.file, ": tensor '", tensor.name, "' (", dtype_name(tensor.dtype), ") holds ",
               non_finite_name(tensor.data, tensor.dtype, size_t(bad)), " at element ", bad,
               cols > 0 ? str_cat(" (row ", bad / cols, ", column ", bad % cols, ")") : std::string(),
               ": the checkpoint is broken (re-download or re-convert it)");
}

Expected<WeightMatrix> matrix(const WeightStore& store, const std::string& name, int64_t rows, int64_t cols) {
  SLIMKV_ASSIGN_OR_RETURN(TensorInfo tensor, store.get(name, {rows, cols}));
  SLIMKV_RETURN_IF_ERROR(check_finite(tensor, cols));
  return WeightMatrix{tensor.data, tensor.dtype, rows, cols, tensor.quant};
}

Expected<std::vector<float>> vector(const WeightStore& store, const std::string& name, int64_t size) {
  SLIMKV_ASSIGN_OR_RETURN(TensorInfo tensor, store.get(name, {size}));
  if (tensor.quant != BlockQuant::kNone) {
    return error(tensor.file, ": tensor '", name, "' is ", block_quant_name(tensor.quant),
                 ", expected F32/F16/BF16 for a vector (llama.cpp's converter keeps them F32)");
  }
  SLIMKV_RETURN_IF_ERROR(check_finite(tensor, /*cols=*/0));
  std::vector<float> values(static_cast<size_t>(size));
  widen_to_f32(tensor.data, tensor.dtype, values.data(), values.size());
  return values;
}

// An RMSNorm weight as the forward pass multiplies by it: Gemma's stored w is an offset, it scales by 1 + w
// (computed in FP32 as transformers does).
Expected<std::vector<float>> norm(const WeightStore& store, const std::string& name, int64_t size,
                                  const ModelConfig& config) {
  SLIMKV_ASSIGN_OR_RETURN(std::vector<float> weight, vector(store, name, size));
  if (config.norm_adds_one) {
    for (float& w : weight) w = 1.0f + w;
  }
  return weight;
}

Expected<MlpWeights> mlp(const WeightStore& store, const std::string& prefix, int64_t hidden, int64_t inter) {
  MlpWeights weights;
  SLIMKV_ASSIGN_OR_RETURN(weights.gate, matrix(store, prefix + "gate_proj.weight", inter, hidden));
  SLIMKV_ASSIGN_OR_RETURN(weights.up, matrix(store, prefix + "up_proj.weight", inter, hidden));
  SLIMKV_ASSIGN_OR_RETURN(weights.down, matrix(store, prefix + "down_proj.weight", hidden, inter));
  return weights;
}

}  // namespace

Expected<LlamaWeights> LlamaWeights::load(const WeightStore& store, const ModelConfig& config) {
  const int64_t hidden = config.hidden_size, inter = config.intermediate_size;
  const int64_t q_dim = config.q_dim(), kv_dim = config.kv_dim();
  LlamaWeights weights;
  SLIMKV_ASSIGN_OR_RETURN(weights.embedding, matrix(store, "model.embed_tokens.weight", config.vocab_size, hidden));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string prefix = str_cat("model.layers.", i, ".");
    LayerWeights layer;
    SLIMKV_ASSIGN_OR_RETURN(layer.attention_norm, norm(store, prefix + "input_layernorm.weight", hidden, config));
    SLIMKV_ASSIGN_OR_RETURN(layer.wq, matrix(store, prefix + "self_attn.q_proj.weight", q_dim, hidden));
    SLIMKV_ASSIGN_OR_RETURN(layer.wk, matrix(store, prefix + "self_attn.k_proj.weight", kv_dim, hidden));
    SLIMKV_ASSIGN_OR_RETURN(layer.wv, matrix(store, prefix + "self_attn.v_proj.weight", kv_dim, hidden));
    if (config.attention_bias) {
      SLIMKV_ASSIGN_OR_RETURN(layer.bq, vector(store, prefix + "self_attn.q_proj.bias", q_dim));
      SLIMKV_ASSIGN_OR_RETURN(layer.bk, vector(store, prefix + "self_attn.k_proj.bias", kv_dim));
      SLIMKV_ASSIGN_OR_RETURN(layer.bv, vector(store, prefix + "self_attn.v_proj.bias", kv_dim));
    }
    if (config.qk_norm) {
      SLIMKV_ASSIGN_OR_RETURN(layer.q_norm, norm(store, prefix + "self_attn.q_norm.weight", config.head_dim, config));
      SLIMKV_ASSIGN_OR_RETURN(layer.k_norm, norm(store, prefix + "self_attn.k_norm.weight", config.head_dim, config));
    }
    SLIMKV_ASSIGN_OR_RETURN(layer.wo, matrix(store, prefix + "self_attn.o_proj.weight", hidden, q_dim));
    if (config.sandwich_norms) {
      SLIMKV_ASSIGN_OR_RETURN(layer.attention_out_norm,
                              norm(store, prefix + "post_attention_layernorm.weight", hidden, config));
      SLIMKV_ASSIGN_OR_RETURN(layer.mlp_norm, norm(store, prefix + "pre_feedforward_layernorm.weight", hidden, config));
      SLIMKV_ASSIGN_OR_RETURN(layer.mlp_out_norm,
                              norm(store, prefix + "post_feedforward_layernorm.weight", hidden, config));
    } else {
      SLIMKV_ASSIGN_OR_RETURN(layer.mlp_norm, norm(store, prefix + "post_attention_layernorm.weight", hidden, config));
    }
    if (config.is_sparse(i)) {  // the Hub's layout: a router and one tensor per expert
      const MoeConfig& moe = config.moe;
      SLIMKV_ASSIGN_OR_RETURN(layer.router, matrix(store, prefix + "mlp.gate.weight", moe.num_experts, hidden));
      for (int64_t e = 0; e < moe.num_experts; ++e) {
        SLIMKV_ASSIGN_OR_RETURN(MlpWeights expert, mlp(store, str_cat(prefix, "mlp.experts.", e, "."), hidden,
                                                       moe.expert_intermediate_size));
        layer.experts.push_back(expert);
      }
    } else {
      SLIMKV_ASSIGN_OR_RETURN(layer.mlp, mlp(store, prefix + "mlp.", hidden, inter));
    }
    weights.layers.push_back(std::move(layer));
  }
  SLIMKV_ASSIGN_OR_RETURN(weights.final_norm, norm(store, "model.norm.weight", hidden, config));
  if (config.tie_word_embeddings) {
    weights.lm_head = weights.embedding;  // transformers ties them even if lm_head.weight is also stored
  } else {
    SLIMKV_ASSIGN_OR_RETURN(weights.lm_head, matrix(store, "lm_head.weight", config.vocab_size, hidden));
  }
  return weights;
}

}  // namespace slimkv
