#!/usr/bin/python3
"""Makes the GGUF test fixtures of tests/data/gguf/ with llama.cpp's own tools, and llama.cpp's logits
and token ids on them as goldens.

  scripts/gguf/make_fixtures.py --llama-cpp SRC --tools BIN --out tests/data/gguf

SRC: a llama.cpp source tree (convert_hf_to_gguf.py, gguf-py/); BIN: a folder with llama_ref
(scripts/gguf/llama_ref.cpp built against its libllama by build_llama_tools.sh).
Needs numpy, torch, sentencepiece and protobuf (Debian: python3-numpy, python3-torch, python3-sentencepiece,
python3-protobuf).

1. Tiny random Hugging Face models (scripts/make_random_model.py's weights; a byte-level tokenizer of
   256 byte tokens and 64 merges of letter pairs, so the files stay small) are written to a scratch folder.
2. convert_hf_to_gguf.py turns each into an F16 GGUF. The converter identifies a BPE pre-tokenizer by
   hashing the ids transformers' AutoTokenizer gives for a probe text, which needs transformers (not a
   Debian package) and knows only published tokenizers; so this script imports the converter and
   replaces only its vocabulary reader (`get_vocab_base`) by one that reads tokenizer.json directly
   and names the pre-tokenizer by its split regex. Weights, metadata, Q/K permutation, merges and
   special tokens are the converter's own.
3. llama.cpp's quantizer (llama_model_quantize, what llama-quantize runs) makes Q8_0, Q4_0 and
   Q4_K_M (Q4_K + Q6_K tensors) files from the F16 one.
4. llama_ref writes llama.cpp's logits for a fixed token sequence (all positions) next to each file,
   and those of each model's F16 file (the quantization's own error is measured against them).
5. blocks.gguf: random blocks of each quantized type with gguf-py's own numpy dequantization of them
   (an independent reference for slimkv's block layouts), and small GGUF files as fuzz seeds
   (fuzz/corpus/gguf_fuzz/), all written by gguf-py's GGUFWriter.
6. Vocabulary-only GGUFs of tests/data/tokenizers/{llama3_style,qwen2_style} test the tokenizer read
   from metadata; llama_ref --tokenize writes llama.cpp's ids for their golden texts.
7. SentencePiece tokenizers (python3-sentencepiece trains them): the Gemma 3 fixture's, and
   Llama-2-style vocabulary-only files (one with all merge scores tied, edited in by python3-protobuf);
   their goldens are sentencepiece's ids and llama.cpp's. --only-spm NAME remakes one of those files.
"""
import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# The fixture models. Q4_K needs rows of 256 values, so the model quantized to Q4_K_M has 256-wide
# matrices; the others are as small as a real multi-layer GQA model gets (Q8_0: rows of 32).
# family "llama"/"qwen2": random Llama-shaped weights (write_model); "hf": a golden model of
# tests/data/models (transformers' weights and logits); "qwen3moe"/"gemma3": random weights of that
# family (write_family_model), whose Hugging Face checkpoint is kept beside the GGUF files (hf/NAME/)
# so slimkv's safetensors path, held to transformers by tests/engine/hf_parity_test.cc, is the bridge.
# The Hub's other tiny models of these families do not fit llama.cpp: it has no mlp_only_layers or
# decoder_sparse_step, always renormalises Qwen3-MoE's top k, and fixes Gemma 3's layer pattern (every
# 6th layer global), sliding RoPE base (10000) and query scale (1/sqrt(head_dim)).
MODELS = {
    "llama_tiny": dict(arch="LlamaForCausalLM", model_type="llama", vocab_size=320, hidden_size=64,
                       intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, tie=False, bias=False, types=["F16", "Q8_0", "Q4_0"]),
    "qwen2_tiny": dict(arch="Qwen2ForCausalLM", model_type="qwen2", vocab_size=320, hidden_size=64,
                       intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                       head_dim=16, tie=True, bias=True, types=["Q8_0"]),
    "llama_k": dict(arch="LlamaForCausalLM", model_type="llama", vocab_size=320, hidden_size=256,
                    intermediate_size=256, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                    head_dim=128, tie=True, bias=False, types=["Q4_K_M"]),
    "qwen3_tiny": dict(family="hf", source="qwen3_bf16_tied", types=["F16"]),
    "qwen3moe_tiny": dict(family="qwen3moe", arch="Qwen3MoeForCausalLM", model_type="qwen3_moe", vocab_size=320,
                          hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, types=["F16", "Q8_0"]),
    "gemma3_tiny": dict(family="gemma3", arch="Gemma3ForCausalLM", model_type="gemma3_text", vocab_size=384,
                        hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=16, sliding_window=8, types=["F16", "Q8_0"]),
}
# SentencePiece tokenizers (BPE with byte fallback, trained on the bundled model's held-out text):
# the Gemma 3 fixture's vocabulary (no space prefix, Gemma's special ids) and a Llama-2-style one for
# a vocabulary-only file.
SPM_TOKENIZERS = {
    "gemma3": dict(vocab_size=384, add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                   pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>"),
    "llama": dict(vocab_size=1000, add_dummy_prefix=True, pad_id=-1, eos_id=2, bos_id=1, unk_id=0),
    # The Llama-2-style vocabulary with every piece's score -1000, as gguf-py's LlamaHfVocab writes a
    # vocabulary that comes without scores: all merges tie, and llama.cpp and sentencepiece merge the
    # leftmost pair of a word first, where a rank order of merges (tokenizer.json's BPE) would apply
    # each merge everywhere before the next. (Scores rounded to multiples of 8 or 32 change no text's
    # ids: ties between merges that compete for one character are rare until most merges tie.)
    "llama_ties": dict(vocab_size=1000, add_dummy_prefix=True, pad_id=-1, eos_id=2, bos_id=1, unk_id=0,
                       tied_score=-1000.0),
}
VOCAB_ONLY_SPM = ["llama", "llama_ties"]  # written as vocabulary-only files vocab-spm_NAME.gguf
# The token ids every golden is computed for (any ids below 256).
TOKENS = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 200, 17, 255, 0, 64, 65, 66, 67, 13]

LLAMA3_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
PRE_BY_SPLIT = {LLAMA3_SPLIT: "llama-bpe", QWEN2_SPLIT: "qwen2"}


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_model(out, spec, seed):
    rm = load_module("make_random_model", os.path.join(REPO, "scripts", "make_random_model.py"))
    os.makedirs(out, exist_ok=True)
    config = dict(vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"],
                  intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_hidden_layers"],
                  num_attention_heads=spec["num_attention_heads"], num_key_value_heads=spec["num_key_value_heads"],
                  head_dim=spec["head_dim"])
    rng = np.random.default_rng(seed)
    tensors = []
    for name, shape in rm.tensor_shapes(config):
        if name == "lm_head.weight" and spec["tie"]:
            continue
        if len(shape) == 1:  # norms around 1, not all 1, so a wrong norm shows
            tensors.append((name, rm.bf16_bits(rng.uniform(0.5, 1.5, size=shape).astype(np.float32))))
        else:
            tensors.append((name, rm.random_weight(rng, shape)))
        if spec["bias"] and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            bias = rm.bf16_bits(rng.uniform(-0.5, 0.5, size=(shape[0],)).astype(np.float32))
            tensors.append((name.replace(".weight", ".bias"), bias))
    rm.write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    config.update(architectures=[spec["arch"]], model_type=spec["model_type"], hidden_act="silu",
                  max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=spec["tie"], torch_dtype="bfloat16", bos_token_id=0, eos_token_id=1)
    if spec["model_type"] == "qwen2":
        config.pop("head_dim")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_byte_level_tokenizer(out)


def write_byte_level_tokenizer(out):
    bpe = load_module("bpe", os.path.join(REPO, "scripts", "train", "bpe.py"))
    alphabet = bpe.byte_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    pairs = [a + b for a in "etaoinsh" for b in "etaoinsh"]  # 64 merges, llama.cpp wants at least one
    for pair in pairs:
        vocab[pair] = len(vocab)
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                            "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{p[0]} {p[1]}" for p in pairs]},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)


def train_spm(out, name):
    """A SentencePiece BPE model (tokenizer.model) as Llama 2 and Gemma train theirs: byte fallback,
    identity normalization, spaces kept, digits split; and tokenizer_config.json (add BOS)."""
    import io
    import sentencepiece
    spec = SPM_TOKENIZERS[name]
    with open(os.path.join(REPO, "models", "slimkv-llama-15m", "heldout.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    model = io.BytesIO()
    options = {k: v for k, v in spec.items() if k not in ("vocab_size", "tied_score")}
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=spec["vocab_size"],
        byte_fallback=True, character_coverage=0.9995, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, minloglevel=2, num_threads=2, **options)
    proto = model.getvalue()
    if "tied_score" in spec:  # needs python3-protobuf (sentencepiece's model_pb2)
        from sentencepiece import sentencepiece_model_pb2
        parsed = sentencepiece_model_pb2.ModelProto()
        parsed.ParseFromString(proto)
        for piece in parsed.pieces:
            if piece.type == sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL:
                piece.score = spec["tied_score"]
        proto = parsed.SerializeToString()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.model"), "wb") as f:
        f.write(proto)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False}, f)
    return sentencepiece.SentencePieceProcessor(model_proto=proto)


def family_tensor_shapes(spec):
    """(name, shape) of a Qwen3-MoE or Gemma 3 checkpoint's weights, as transformers names them."""
    h, hd = spec["hidden_size"], spec["head_dim"]
    q, kv = spec["num_attention_heads"] * hd, spec["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (spec["vocab_size"], h)
    for i in range(spec["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "self_attn.q_norm.weight", (hd,)
        yield p + "self_attn.k_norm.weight", (hd,)
        yield p + "post_attention_layernorm.weight", (h,)
        if spec["family"] == "gemma3":
            yield p + "pre_feedforward_layernorm.weight", (h,)
            yield p + "post_feedforward_layernorm.weight", (h,)
            for proj, shape in [("gate_proj", (spec["intermediate_size"], h)), ("up_proj", (spec["intermediate_size"], h)),
                                ("down_proj", (h, spec["intermediate_size"]))]:
                yield p + "mlp." + proj + ".weight", shape
        else:
            ff = spec["moe_intermediate_size"]
            yield p + "mlp.gate.weight", (spec["num_experts"], h)
            for e in range(spec["num_experts"]):
                for proj, shape in [("gate_proj", (ff, h)), ("up_proj", (ff, h)), ("down_proj", (h, ff))]:
                    yield p + f"mlp.experts.{e}.{proj}.weight", shape
    yield "model.norm.weight", (h,)


def write_family_model(out, spec, seed):
    """A random Qwen3-MoE or Gemma 3 checkpoint (BF16, tied embeddings) with config.json as transformers
    4.x writes it (what this converter reads), and its tokenizer."""
    rm = load_module("make_random_model", os.path.join(REPO, "scripts", "make_random_model.py"))
    rng = np.random.default_rng(seed)
    gemma = spec["family"] == "gemma3"
    tensors = []
    for name, shape in family_tensor_shapes(spec):
        if len(shape) == 1:  # Gemma stores the offset from 1: norms around 1 either way, not all 1
            center = 0.0 if gemma else 1.0
            tensors.append((name, rm.bf16_bits(rng.uniform(center - 0.5, center + 0.5, size=shape).astype(np.float32))))
        elif name.endswith("mlp.gate.weight"):  # router logits spread out, so the top-k choice is clear-cut
            tensors.append((name, rm.bf16_bits(rng.normal(0, 2.0 / np.sqrt(shape[1]), size=shape).astype(np.float32))))
        else:
            tensors.append((name, rm.random_weight(rng, shape)))
    os.makedirs(out, exist_ok=True)
    rm.write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim"]
    config = {k: spec[k] for k in keys}
    config.update(architectures=[spec["arch"]], model_type=spec["model_type"], max_position_embeddings=512,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="bfloat16", attention_bias=False)
    if gemma:
        config.update(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=spec["head_dim"],
                      sliding_window=spec["sliding_window"], sliding_window_pattern=6, rope_theta=1000000.0,
                      rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
                      final_logit_softcapping=None, attn_logit_softcapping=None, bos_token_id=2, eos_token_id=1,
                      pad_token_id=0)
        train_spm(out, "gemma3")
    else:
        config.update(hidden_act="silu", rope_theta=1000000.0, num_experts=spec["num_experts"],
                      num_experts_per_tok=spec["num_experts_per_tok"], moe_intermediate_size=spec["moe_intermediate_size"],
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                      sliding_window=None, bos_token_id=0, eos_token_id=1)
        write_byte_level_tokenizer(out)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def copy_golden_model(out, spec):
    """A golden model of tests/data/models with its 4.x config.json (this converter reads rope_theta at the
    top level) and a byte-level tokenizer (those models have none; the converter wants one)."""
    src = os.path.join(REPO, "tests", "data", "models", spec["source"])
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(src, "model.safetensors"), out)
    shutil.copy(os.path.join(src, "config.v4.json"), os.path.join(out, "config.json"))
    write_byte_level_tokenizer(out)


class SafetensorsSlice:
    """What the converter's lazy loader asks of a safetensors tensor: dtype name, shape, s[:]."""

    def __init__(self, array, dtype):
        self.array, self.dtype = array, dtype

    def get_dtype(self):
        return self.dtype

    def get_shape(self):
        return list(self.array.shape)

    def __getitem__(self, key):
        import torch
        values = np.ascontiguousarray(self.array[key])
        tensor = torch.from_numpy(values.view(np.int16) if self.dtype == "BF16" else values)
        return tensor.view(torch.bfloat16) if self.dtype == "BF16" else tensor


class SafeOpen:
    """A stand-in for the `safetensors` package's safe_open (not packaged by Debian): the file mapped
    with numpy, each tensor handed out as a slice (the converter's lazy path) or whole."""
    NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}

    def __init__(self, path, framework="pt", device="cpu"):
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            self.header = json.loads(f.read(length))
        self.header.pop("__metadata__", None)
        self.data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + length)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False

    def keys(self):
        return list(self.header)

    def get_slice(self, name):
        info = self.header[name]
        begin, end = info["data_offsets"]
        array = self.data[begin:end].view(self.NUMPY[info["dtype"]]).reshape(info["shape"])
        return SafetensorsSlice(array, info["dtype"])

    def get_tensor(self, name):
        return self.get_slice(name)[...]


def import_converter(llama_cpp):
    """llama.cpp's convert_hf_to_gguf with stand-ins for the packages it imports but these models never
    use (transformers' AutoConfig: the converter falls back to config.json; mistral_common) or that
    Debian does not package (safetensors: SafeOpen above)."""
    sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    safetensors = types.ModuleType("safetensors")
    safetensors.safe_open = SafeOpen
    sys.modules["safetensors"] = safetensors
    transformers = types.ModuleType("transformers")

    class AutoConfig:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise RuntimeError("transformers is not installed: reading config.json")
    transformers.AutoConfig = AutoConfig
    sys.modules["transformers"] = transformers
    for name, attrs in {"mistral_common": [], "mistral_common.tokens": [], "mistral_common.tokens.tokenizers": [],
                        "mistral_common.tokens.tokenizers.base": ["TokenizerVersion"],
                        "mistral_common.tokens.tokenizers.multimodal": ["DATASET_MEAN", "DATASET_STD"],
                        "mistral_common.tokens.tokenizers.tekken": ["Tekkenizer"],
                        "mistral_common.tokens.tokenizers.sentencepiece": ["SentencePieceTokenizer"]}.items():
        module = types.ModuleType(name)
        for attr in attrs:
            setattr(module, attr, None)
        sys.modules[name] = module
    # Debian's torch (1.13) predates the float8 dtypes the converter lists for other checkpoints'
    # safetensors; these models hold none, so placeholders keep its dtype table importable.
    import torch
    for name in ["float8_e4m3fn", "float8_e5m2"]:
        if not hasattr(torch, name):
            setattr(torch, name, torch.uint8)
    conv = load_module("convert_hf_to_gguf", os.path.join(llama_cpp, "convert_hf_to_gguf.py"))
    gguf = sys.modules["gguf"]

    def get_vocab_base(self):
        """The converter's get_vocab_base, reading tokenizer.json instead of AutoTokenizer."""
        with open(self.dir_model / "tokenizer.json", encoding="utf-8") as f:
            tokenizer = json.load(f)
        vocab = dict(tokenizer["model"]["vocab"])
        added = {t["id"]: t for t in tokenizer["added_tokens"]}
        for token_id, token in added.items():
            vocab[token["content"]] = token_id
        vocab_size = self.hparams.get("vocab_size", len(vocab))
        reverse = {i: t for t, i in vocab.items()}
        tokens, toktypes = [], []
        for i in range(vocab_size):
            if i not in reverse:
                tokens.append(f"[PAD{i}]")
                toktypes.append(gguf.TokenType.UNUSED)
            elif i in added:
                tokens.append(reverse[i])
                toktypes.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
            else:
                tokens.append(reverse[i])
                toktypes.append(gguf.TokenType.NORMAL)
        pre = tokenizer["pre_tokenizer"]
        split = next((p["pattern"]["Regex"] for p in pre.get("pretokenizers", []) if p["type"] == "Split"), None)
        tokpre = PRE_BY_SPLIT[split] if split else "gpt-2"
        return tokens, toktypes, tokpre

    def llama_set_vocab(self):
        """LlamaModel.set_vocab less its transformers fallback: SentencePiece, else tokenizer.json."""
        if (self.dir_model / "tokenizer.model").is_file():
            self._set_vocab_sentencepiece()
        else:
            self._set_vocab_gpt2()

    conv.TextModel.get_vocab_base = get_vocab_base
    conv.LlamaModel.set_vocab = llama_set_vocab
    conv.Qwen2Model.set_vocab = conv.TextModel._set_vocab_gpt2
    return conv


def write_blocks(gguf, out_file, seed):
    """Random raw blocks of each type slimkv reads (scales kept finite and modest) and, beside each,
    gguf-py's dequantization of them as F32."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(out_file, "llama")
    for qtype in [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_K,
                  gguf.GGMLQuantizationType.Q6_K]:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        rows, blocks_per_row = 2, 512 // block_size
        raw = rng.integers(0, 256, size=(rows * blocks_per_row, type_size), dtype=np.uint8)
        scale_bytes = {"Q8_0": [0], "Q4_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}[qtype.name]
        for offset in scale_bytes:
            scales = rng.uniform(0.001, 0.05, size=rows * blocks_per_row).astype(np.float16)
            raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
        raw = raw.reshape(rows, blocks_per_row * type_size)
        writer.add_tensor(qtype.name, raw, raw_shape=(rows, blocks_per_row * type_size), raw_dtype=qtype)
        writer.add_tensor(qtype.name + ".f32", gguf.quants.dequantize(raw, qtype).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_fuzz_seeds(gguf, folder, seed):
    """Small valid files: every metadata value type (nested arrays too), each tensor type, alignment 64."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name, alignment in [("all_types", None), ("aligned_64", 64)]:
        writer = gguf.GGUFWriter(os.path.join(folder, name + ".gguf"), "llama")
        if alignment:
            writer.add_custom_alignment(alignment)
        writer.add_uint8("u8", 7)
        writer.add_int8("i8", -7)
        writer.add_uint16("u16", 700)
        writer.add_int16("i16", -700)
        writer.add_uint32("u32", 70000)
        writer.add_int32("i32", -70000)
        writer.add_float32("f32", 0.5)
        writer.add_uint64("u64", 1 << 40)
        writer.add_int64("i64", -(1 << 40))
        writer.add_float64("f64", 0.25)
        writer.add_bool("bool", True)
        writer.add_string("str", "tokens ▁Ġ")
        writer.add_array("strings", ["a", "b"])
        writer.add_array("ints", [1, 2, 3])
        writer.add_array("nested", [[1, 2], [3]])
        writer.add_tensor("f32", rng.standard_normal((2, 32)).astype(np.float32))
        writer.add_tensor("f16", rng.standard_normal((2, 32)).astype(np.float16))
        for qtype in [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_K,
                      gguf.GGMLQuantizationType.Q6_K]:
            block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, size=(1, type_size * (256 // block_size)), dtype=np.uint8)
            writer.add_tensor(qtype.name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


def convert(conv, model_dir, out_file, vocab_only=False):
    argv = [str(model_dir), "--outfile", str(out_file), "--outtype", "f16"] + (["--vocab-only"] if vocab_only else [])
    saved = sys.argv
    sys.argv = ["convert_hf_to_gguf.py"] + argv
    try:
        conv.main()
    finally:
        sys.argv = saved


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", required=True, help="llama.cpp source tree")
    parser.add_argument("--tools", required=True, help="folder with llama_ref")
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default="/tmp/slimkv-gguf-fixtures")
    parser.add_argument("--only-spm", choices=VOCAB_ONLY_SPM, help="remake only vocab-spm_NAME.gguf and its goldens")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    if args.only_spm:
        return main_one_spm(args)
    conv = import_converter(args.llama_cpp)
    logits_tool = os.path.join(args.tools, "llama_ref")
    manifest = {"tokens": TOKENS, "models": {}, "tokenizers": {}}

    for index, (name, spec) in enumerate(MODELS.items()):
        model_dir = os.path.join(args.work, name)
        family = spec.get("family", "llama")
        if family == "hf":
            copy_golden_model(model_dir, spec)
        elif family in ("qwen3moe", "gemma3"):
            write_family_model(model_dir, spec, seed=100 + index)
            hf_copy = os.path.join(args.out, "hf", name)
            os.makedirs(hf_copy, exist_ok=True)
            for file in ["model.safetensors", "config.json"]:
                shutil.copy(os.path.join(model_dir, file), hf_copy)
        else:
            write_model(model_dir, spec, seed=100 + index)
        f16 = os.path.join(args.work, f"{name}-F16.gguf")
        convert(conv, model_dir, f16)
        # llama.cpp's logits of the F16 file: how far a quantized file's logits are from them is the
        # quantization's own error, the bar slimkv's distance to llama.cpp on that file is held to.
        f16_logits = os.path.join(args.out, f"{name}-F16.logits.f32")
        subprocess.run([logits_tool, f16, f16_logits] + [str(t) for t in TOKENS], check=True)
        for qtype in spec["types"]:
            out = os.path.join(args.out, f"{name}-{qtype}.gguf")
            if qtype == "F16":
                shutil.copy(f16, out)
            else:
                subprocess.run([logits_tool, "--quantize", f16, out, qtype], check=True, stdout=subprocess.DEVNULL)
            golden = out.replace(".gguf", ".logits.f32")
            if qtype != "F16":
                subprocess.run([logits_tool, out, golden] + [str(t) for t in TOKENS], check=True)
            entry = {"source": name, "type": qtype, "logits": os.path.basename(golden),
                     "f16_logits": os.path.basename(f16_logits)}
            # The same model as safetensors, for the F16 file: transformers' own logits (golden models)
            # or the checkpoint itself.
            if qtype == "F16" and family == "hf":
                entry["transformers_golden"] = f"tests/data/models/{spec['source']}"
            elif qtype == "F16" and family != "llama":
                entry["hf_checkpoint"] = f"tests/data/gguf/hf/{name}"
            manifest["models"][os.path.basename(out)] = entry

    gguf = sys.modules["gguf"]
    write_blocks(gguf, os.path.join(args.out, "blocks.gguf"), seed=7)
    write_fuzz_seeds(gguf, os.path.join(REPO, "fuzz", "corpus", "gguf_fuzz"), seed=8)
    # A whole model of a newer family as a seed too: 3-D expert stacks, q/k norms, Q8_0 blocks.
    shutil.copy(os.path.join(args.out, "qwen3moe_tiny-Q8_0.gguf"),
                os.path.join(REPO, "fuzz", "corpus", "gguf_fuzz", "qwen3moe_tiny-Q8_0.gguf"))

    for name in ["llama3_style", "qwen2_style"]:
        src = os.path.join(REPO, "tests", "data", "tokenizers", name)
        model_dir = os.path.join(args.work, f"vocab-{name}")
        os.makedirs(model_dir)
        shutil.copy(os.path.join(src, "tokenizer.json"), model_dir)
        with open(os.path.join(src, "tokenizer.json")) as f:
            tokenizer = json.load(f)
        ids = list(tokenizer["model"]["vocab"].values()) + [t["id"] for t in tokenizer["added_tokens"]]
        vocab_size = max(ids) + 1
        # The converter needs a config for the architecture; the vocabulary-only file holds no weights.
        arch = "LlamaForCausalLM" if name == "llama3_style" else "Qwen2ForCausalLM"
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(dict(architectures=[arch], vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5,
                           max_position_embeddings=4096, bos_token_id=0, eos_token_id=1), f)
        out = os.path.join(args.out, f"vocab-{name}.gguf")
        convert(conv, model_dir, out, vocab_only=True)
        with open(os.path.join(src, "golden.json")) as f:
            golden = json.load(f)
        texts = [case["text"] for case in golden["cases"]] if "cases" in golden else [c["text"] for c in golden]
        ids = []
        for text in texts:
            result = subprocess.run([logits_tool, "--tokenize", out], input=text.encode(), check=True,
                                    capture_output=True)
            ids.append(json.loads(result.stdout))
        manifest["tokenizers"][os.path.basename(out)] = {"source": name, "llama_cpp_ids": ids}

    texts = spm_texts()
    manifest["spm_tokenizers"] = {"texts": texts}
    files = [(f"vocab-spm_{name}.gguf", write_spm_vocab_file(conv, args.work, args.out, name)) for name in VOCAB_ONLY_SPM]
    files.append(("gemma3_tiny-F16.gguf", os.path.join(args.work, "gemma3_tiny")))
    for file, spm_dir in files:
        manifest["spm_tokenizers"][file] = spm_goldens(os.path.join(args.out, file), spm_dir, texts, logits_tool)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, ensure_ascii=False)


def spm_texts():
    """The SentencePiece goldens' texts: the first 30 SentencePiece golden texts up to 700 characters."""
    with open(os.path.join(REPO, "tests", "data", "tokenizers", "spm_byte_fallback", "golden.json")) as f:
        return [case["text"] for case in json.load(f) if len(case["text"]) <= 700][:30]  # 2 random texts


def write_spm_vocab_file(conv, work, out, name):
    """A vocabulary-only GGUF of SentencePiece tokenizer `name` (SPM_TOKENIZERS), by the converter;
    returns the folder of its tokenizer.model."""
    model_dir = os.path.join(work, f"vocab-spm_{name}")
    train_spm(model_dir, name)
    spec = SPM_TOKENIZERS[name]
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(dict(architectures=["LlamaForCausalLM"], vocab_size=spec["vocab_size"], hidden_size=64,
                       intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                       rms_norm_eps=1e-5, max_position_embeddings=4096, bos_token_id=spec["bos_id"],
                       eos_token_id=spec["eos_id"]), f)
    convert(conv, model_dir, os.path.join(out, f"vocab-spm_{name}.gguf"), vocab_only=True)
    return model_dir


def spm_goldens(gguf_file, spm_dir, texts, logits_tool):
    """sentencepiece's own ids (its tokenizer.model in spm_dir) and llama.cpp's on the GGUF file."""
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(spm_dir, "tokenizer.model"))
    llama_cpp_ids = []
    for text in texts:
        result = subprocess.run([logits_tool, "--tokenize", gguf_file], input=text.encode(), check=True,
                                capture_output=True)
        llama_cpp_ids.append(json.loads(result.stdout))
    return {"sentencepiece_ids": [sp.encode(text) for text in texts], "llama_cpp_ids": llama_cpp_ids}


def main_one_spm(args):
    """--only-spm NAME: remakes only vocab-spm_NAME.gguf and its goldens in an existing manifest."""
    with open(os.path.join(args.out, "manifest.json")) as f:
        manifest = json.load(f)
    conv = import_converter(args.llama_cpp)
    spm_dir = write_spm_vocab_file(conv, args.work, args.out, args.only_spm)
    file = os.path.join(args.out, f"vocab-spm_{args.only_spm}.gguf")
    manifest["spm_tokenizers"][os.path.basename(file)] = spm_goldens(
        file, spm_dir, manifest["spm_tokenizers"]["texts"], os.path.join(args.tools, "llama_ref"))
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
