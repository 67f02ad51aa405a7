#!/usr/bin/env python3
"""Decode attention, slimkv's paged FP16 kernel vs PyTorch's scaled_dot_product_attention (FP16), on
the same GPU in the same run: runs bench_decode_attention_cuda, then SDPA on the same shapes
(q [batch, heads, new tokens, d], K/V [batch, kv_heads, context, d], enable_gqa; with --new-tokens N > 1
a causal prefill chunk at the end of the context, masked lower-right), and prints both with the ratio,
GB/s of KV read and TFLOP/s.

  python3 bench/cuda/decode_attention_vs_sdpa.py --slimkv build/release/bench_decode_attention_cuda
"""
import argparse
import json
import subprocess
import tempfile

import torch
import torch.nn.functional as F
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--slimkv", required=True, help="path of bench_decode_attention_cuda")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--contexts", default="4096,8192,16384,32768,65536,131072")
    parser.add_argument("--new-tokens", type=int, default=1, help="queries per sequence (1: decode)")
    parser.add_argument("--repetitions", type=int, default=30)
    args = parser.parse_args()
    shape = ["--batch", str(args.batch), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
             "--head-dim", str(args.head_dim), "--new-tokens", str(args.new_tokens),
             "--repetitions", str(args.repetitions)]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([args.slimkv, *shape, "--contexts", args.contexts, "--json", out.name], check=True)
        slimkv = {row["context"]: row for row in json.load(open(out.name))}

    print(f"\nattention on {torch.cuda.get_device_name()}: batch {args.batch}, {args.new_tokens} new tokens each, "
          f"{args.heads} q / {args.kv_heads} kv heads, d {args.head_dim}, FP16 (torch {torch.__version__})")
    print(f"{'context':>8} {'slimkv ms':>10} {'SDPA ms':>9} {'slimkv GB/s':>12} {'SDPA GB/s':>10} "
          f"{'slimkv TFLOP/s':>15} {'SDPA TFLOP/s':>13} {'slimkv/SDPA throughput':>23}")
    for context in (int(c) for c in args.contexts.split(",")):
        kv_bytes = 2 * args.batch * args.kv_heads * context * args.head_dim * 2
        n = args.new_tokens
        flops = 4 * args.batch * args.heads * args.head_dim * (n * context - n * (n - 1) / 2)
        ours = slimkv[context]["ms"]
        theirs = sdpa_ms(args.batch, args.heads, args.kv_heads, args.head_dim, context, n, args.repetitions)
        print(f"{context:>8} {ours:>10.4f} {theirs:>9.4f} {kv_bytes / ours / 1e6:>12.0f} "
              f"{kv_bytes / theirs / 1e6:>10.0f} {flops / ours / 1e9:>15.1f} {flops / theirs / 1e9:>13.1f} "
              f"{theirs / ours:>22.2f}x")


if __name__ == "__main__":
    main()
