#!/usr/bin/python3
"""Makes the GGUF test fixtures of tests/data/gguf/ with llama.cpp's own tools, and llama.cpp's logits
and token ids on them as goldens.

  scripts/gguf/make_fixtures.py --llama-cpp SRC --tools BIN --out tests/data/gguf

SRC: a llama.cpp source tree (convert_hf_to_gguf.py, gguf-py/); BIN: a folder with llama_ref
(scripts/gguf/llama_ref.cpp built against its libllama by build_llama_tools.sh).
Needs numpy and torch (Debian: python3-numpy, python3-torch).

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
# matrices; the others are as small as a real multi-layer GQA model gets.
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
}
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

    conv.TextModel.get_vocab_base = get_vocab_base
    conv.LlamaModel.set_vocab = conv.TextModel._set_vocab_gpt2
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
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    conv = import_converter(args.llama_cpp)
    logits_tool = os.path.join(args.tools, "llama_ref")
    manifest = {"tokens": TOKENS, "models": {}, "tokenizers": {}}

    for index, (name, spec) in enumerate(MODELS.items()):
        model_dir = os.path.join(args.work, name)
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
            manifest["models"][os.path.basename(out)] = {"source": name, "type": qtype,
                                                          "logits": os.path.basename(golden),
                                                          "f16_logits": os.path.basename(f16_logits)}

    gguf = sys.modules["gguf"]
    write_blocks(gguf, os.path.join(args.out, "blocks.gguf"), seed=7)
    write_fuzz_seeds(gguf, os.path.join(REPO, "fuzz", "corpus", "gguf_fuzz"), seed=8)

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

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
