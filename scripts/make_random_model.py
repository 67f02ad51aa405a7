#!/usr/bin/env python3
"""Writes a random-weight model of a real model's shape as a Hugging Face directory (config.json,
sharded BF16 (or --dtype float16) safetensors with their index, tokenizer.json,
generation_config.json), so that slimkv's ordinary loaders, `slimkv serve` and its benchmarks run at
the sizes users deploy (Llama-3-8B: 16 GB of weights) without downloading a checkpoint. The text such a model writes is noise; what it measures is
time and memory: serving throughput, KV capacity, TTFT/TPOT.

  scripts/make_random_model.py --shape llama3-8b --out /tmp/llama3-8b-random

Weights are uniform in ±sqrt(3 / fan_in) (unit variance in, unit variance out, as the CUDA benches'
random models), norms are 1. They are drawn on every core, a block of rows at a time, each block from its
own stream (seed, tensor, first row): the same bytes whatever the number of cores (Llama-3-8B in well
under a minute on 16 cores, where one core took minutes of a GPU call). The tokenizer is the Llama-3-style test tokenizer of tests/data with its
vocabulary padded by never-merged tokens up to the shape's vocabulary, so that every id the model can
sample decodes to text. Needs numpy (Debian: python3-numpy).
"""
import argparse
import concurrent.futures
import json
import os
import struct
import sys

import numpy as np

# Shapes of real checkpoints (their config.json values), the sizes the serving and KV figures are for.
SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=131072, rope_theta=500000.0,
                      rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "llama2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, head_dim=128,
                      max_position_embeddings=131072, rope_theta=10000.0, rope_scaling=None),
    # A small model with a large KV for its compute (8 KV heads of 128 over a 256-wide residual: 16 KB of
    # FP16 KV a token): a CPU prefill of a few thousand tokens is seconds while its KV is 100 MB+, so that
    # disaggregated serving's transfer and prefill are comparable on the CPU (docs/disaggregated.md).
    "kv-heavy": dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=32768, rope_theta=10000.0, rope_scaling=None),
    # A small shape for checking the script and the loaders in seconds.
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 max_position_embeddings=4096, rope_theta=10000.0, rope_scaling=None),
}
SHARD_BYTES = 4 << 30
BLOCK_VALUES = 1 << 22  # values drawn per task: large enough to amortize, small enough to spread
BASE_TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tokenizers",
                              "llama3_style", "tokenizer.json")


def tensor_shapes(c):
    """(name, shape) of every weight, in the order of a Hugging Face Llama checkpoint."""
    h, kv, hd = c["hidden_size"], c["num_key_value_heads"], c["head_dim"]
    q = c["num_attention_heads"] * hd
    yield "model.embed_tokens.weight", (c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv * hd, h)
        yield p + "self_attn.v_proj.weight", (kv * hd, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (c["intermediate_size"], h)
        yield p + "mlp.up_proj.weight", (c["intermediate_size"], h)
        yield p + "mlp.down_proj.weight", (h, c["intermediate_size"])
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (c["vocab_size"], h)


def bf16_bits(values):
    """float32 -> BF16 bit patterns, rounded to nearest even."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def f16_bits(values):
    """float32 -> IEEE half bit patterns."""
    return values.astype(np.float16).view(np.uint16)


# --dtype: the safetensors dtype and the conversion to its bits.
DTYPES = {"bfloat16": ("BF16", bf16_bits), "float16": ("F16", f16_bits)}


def random_weight(rng, shape, dtype="bfloat16"):
    bits = DTYPES[dtype][1]
    if len(shape) == 1:
        return bits(np.ones(shape, np.float32))
    bound = np.sqrt(3.0 / shape[1])
    return bits(rng.uniform(-bound, bound, size=shape).astype(np.float32))


def parallel_random_weight(pool, seed, index, shape, dtype):
    """random_weight of tensor number `index`, drawn in blocks of rows on `pool` (numpy releases the GIL
    while it draws and converts), each block from the stream (seed, index, its first row)."""
    if len(shape) == 1:
        return random_weight(None, shape, dtype)
    out = np.empty(shape, np.uint16)
    rows = max(1, BLOCK_VALUES // shape[1])

    def fill(first):
        last = min(first + rows, shape[0])
        out[first:last] = random_weight(np.random.default_rng([seed, index, first]), (last - first, shape[1]), dtype)
    list(pool.map(fill, range(0, shape[0], rows)))
    return out


def write_safetensors(path, tensors, dtype="BF16"):
    header, offset = {}, 0
    for name, array in tensors:
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for _, array in tensors:
            f.write(np.ascontiguousarray(array).data)  # no bytes copy of a 2 GB tensor


def write_weights(out, config, seed, dtype):
    shards, current, current_bytes = [], [], 0
    for name, shape in tensor_shapes(config):
        nbytes = 2 * int(np.prod(shape))
        if current and current_bytes + nbytes > SHARD_BYTES:
            shards.append(current)
            current, current_bytes = [], 0
        current.append((name, shape))
        current_bytes += nbytes
    shards.append(current)
    weight_map, total, index = {}, 0, 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for shard_index, shard in enumerate(shards):
            file_name = f"model-{shard_index + 1:05d}-of-{len(shards):05d}.safetensors"
            tensors = []
            for name, shape in shard:
                tensors.append((name, parallel_random_weight(pool, seed, index, shape, dtype)))
                index += 1
            write_safetensors(os.path.join(out, file_name), tensors, DTYPES[dtype][0])
            for name, array in tensors:
                weight_map[name] = file_name
                total += array.nbytes
            print(f"  {file_name}: {len(tensors)} tensors", file=sys.stderr)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def write_tokenizer(out, vocab_size):
    with open(BASE_TOKENIZER) as f:
        tokenizer = json.load(f)
    vocab = tokenizer["model"]["vocab"]
    special = {t["id"] for t in tokenizer["added_tokens"]}
    taken = set(vocab.values()) | special
    if len(taken) > vocab_size:
        sys.exit(f"error: the base tokenizer has {len(taken)} tokens, more than the shape's vocab_size {vocab_size}")
    # Byte-level strings that no merge produces: the encoder never emits them, the decoder writes them.
    next_id = 0
    for n in range(vocab_size):
        if len(taken) == vocab_size:
            break
        while next_id in taken:
            next_id += 1
        vocab[f"Ġ<random{n}>"] = next_id
        taken.add(next_id)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    return {t["content"]: t["id"] for t in tokenizer["added_tokens"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--out", required=True, help="directory to create (must not exist, or be empty)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                        help="bfloat16 as Llama-3 checkpoints ship; float16, the dtype slimkv computes in on the "
                             "GPU, loads without a conversion (seconds, not a minute, for a benchmark that "
                             "restarts its server)")
    parser.add_argument("--layers", type=int, default=None,
                        help="keep only this many of the shape's layers (every tensor still at its real shape): "
                             "the 8B shape's per-layer costs on a machine without its 16 GB")
    args = parser.parse_args()
    shape = dict(SHAPES[args.shape])
    if args.layers is not None:
        if not 1 <= args.layers <= shape["num_hidden_layers"]:
            sys.exit(f"error: --layers {args.layers}: expected 1 to {shape['num_hidden_layers']} ({args.shape}'s layers)")
        shape["num_hidden_layers"] = args.layers
    if os.path.isdir(args.out) and os.listdir(args.out):
        sys.exit(f"error: --out {args.out} exists and is not empty")
    os.makedirs(args.out, exist_ok=True)

    specials = write_tokenizer(args.out, shape["vocab_size"])
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "torch_dtype": args.dtype, "bos_token_id": specials["<|begin_of_text|>"],
              "eos_token_id": specials["<|end_of_text|>"], **shape}
    if config["rope_scaling"] is None:
        del config["rope_scaling"]
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, f, indent=2)
    write_weights(args.out, config, args.seed, args.dtype)
    print(f"{args.out}: random {args.shape} ({config['num_hidden_layers']} layers, vocab {config['vocab_size']})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
