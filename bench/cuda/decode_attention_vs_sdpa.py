#!/usr/bin/env python3
"""Decode attention, slimkv's paged kernels vs PyTorch's scaled_dot_product_attention (FP16), on the
same GPU in the same run: runs bench_decode_attention_cuda once per KV codec (--kvs: dense FP16, and
`quant` / `hack` sealed at --bits), then SDPA on the same shapes (q [batch, heads, new tokens, d], K/V
[batch, kv_heads, context, d], enable_gqa; with --new-tokens N > 1 a causal prefill chunk at the end of
the context, masked lower-right; --new-tokens 0: the whole context, a full causal prefill), and prints them side by side: time, SDPA's time over each (the
speed-up), hack over quant, and GB/s of KV read (each codec's own bytes).

  python3 bench/cuda/decode_attention_vs_sdpa.py --slimkv build/release/bench_decode_attention_cuda \
      --kvs dense,quant,hack --bits 2
"""
import argparse
import contextlib
import json
import subprocess
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


def sdpa_ms(batch, heads, kv_heads, head_dim, context, new_tokens, repetitions):
    gen = torch.Generator(device="cuda").manual_seed(context)
    q = torch.randn(batch, heads, new_tokens, head_dim, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(batch, kv_heads, context, head_dim, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(batch, kv_heads, context, head_dim, device="cuda", dtype=torch.float16, generator=gen)
    if new_tokens == 1:
        run = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    else:
        mask = causal_lower_right(new_tokens, context)
        run = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        try:
            run()
        except RuntimeError as e:  # some backends take no GQA with this mask: K/V expanded per query head
            print(f"SDPA: {e}; expanding K/V per query head")
            k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
            run = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repetitions):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 10)
    del q, k, v
    torch.cuda.empty_cache()
    return sorted(times)[len(times) // 2]


def backend_context(name):
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return sdpa_kernel(backends[name]) if name in backends else contextlib.nullcontext()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--slimkv", required=True, help="path of bench_decode_attention_cuda")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--contexts", default="4096,8192,16384,32768,65536,131072")
    parser.add_argument("--new-tokens", type=int, default=1, help="queries per sequence (1: decode, 0: the whole context)")
    parser.add_argument("--repetitions", type=int, default=30)
    parser.add_argument("--kvs", default="dense", help="slimkv codecs to run: dense, quant, hack")
    parser.add_argument("--bits", type=int, default=2, help="bits of quant / hack")
    parser.add_argument("--sdpa-backend", default="default", choices=["default", "flash", "cudnn", "efficient"],
                        help="pin SDPA to one backend (default: PyTorch's choice)")
    args = parser.parse_args()
    shape = ["--batch", str(args.batch), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
             "--head-dim", str(args.head_dim), "--new-tokens", str(args.new_tokens),
             "--repetitions", str(args.repetitions)]
    kvs = args.kvs.split(",")
    slimkv = {}
    for kv in kvs:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run([args.slimkv, *shape, "--kv", kv, "--bits", str(args.bits), "--contexts", args.contexts,
                            "--json", out.name], check=True)
            slimkv[kv] = {row["context"]: row for row in json.load(open(out.name))}

    print(f"\nattention on {torch.cuda.get_device_name()}: batch {args.batch}, {args.new_tokens or 'the whole context as'} new tokens each, "
          f"{args.heads} q / {args.kv_heads} kv heads, d {args.head_dim}; SDPA FP16 (torch {torch.__version__}, backend {args.sdpa_backend}); "
          f"slimkv {', '.join(kv if kv == 'dense' else f'{kv} {args.bits}-bit' for kv in kvs)}")
    header = f"{'context':>8} {'SDPA ms':>9}" + "".join(f" {kv + ' ms':>10}" for kv in kvs)
    header += "".join(f" {'SDPA/' + kv:>11}" for kv in kvs)
    if "hack" in kvs and "quant" in kvs:
        header += f" {'quant/hack':>11}"
    header += f" {'SDPA GB/s':>10}" + "".join(f" {kv + ' GB/s':>11}" for kv in kvs)
    print(header)
    for context in (int(c) for c in args.contexts.split(",")):
        kv_bytes = 2 * args.batch * args.kv_heads * context * args.head_dim * 2
        n = args.new_tokens or context
        with backend_context(args.sdpa_backend):
            theirs = sdpa_ms(args.batch, args.heads, args.kv_heads, args.head_dim, context, n, args.repetitions)
        ours = {kv: slimkv[kv][context]["ms"] for kv in kvs}
        line = f"{context:>8} {theirs:>9.4f}" + "".join(f" {ours[kv]:>10.4f}" for kv in kvs)
        line += "".join(f" {theirs / ours[kv]:>10.2f}x" for kv in kvs)
        if "hack" in kvs and "quant" in kvs:
            line += f" {ours['quant'] / ours['hack']:>10.2f}x"
        line += f" {kv_bytes / theirs / 1e6:>10.0f}" + "".join(f" {slimkv[kv][context]['gb_per_s']:>11.0f}" for kv in kvs)
        print(line)


if __name__ == "__main__":
    main()
