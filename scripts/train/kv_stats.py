#!/usr/bin/env python3
"""The KV statistics that the codecs care about, per layer, for one or more models on the same text:

  outlier channels  K's per-channel RMS over tokens (post-RoPE, as the cache holds it): the largest
                    channel over the median one, and how many channels exceed 4x the median. Per-token
                    quantizers (HACK, KIVI's V) lose the small channels when a few large ones set the scale.
  attention sink    the mean attention mass that queries put on the first token (BOS). Sinks are why
                    StreamingLLM/PQCache keep the initial tokens and why pi partitions matter.
  entropy           the mean attention entropy over log(number of visible tokens): 1 = uniform,
                    0 = one token. Low entropy is what makes top-k selection (PQCache) accurate.

Queries and keys of the first --skip positions are left out of the means (their few visible tokens make
every statistic trivial). Uses the plain FP32 reference of reference_cpu.py (torch, no transformers).

    python3 scripts/train/kv_stats.py --models models/slimkv-llama-15m /tmp/slimkv-llama-14m \\
        --text models/slimkv-llama-15m/heldout.txt --windows 4 --context 1024 \\
        --json models/slimkv-llama-15m/kv_stats.json --plot models/slimkv-llama-15m/kv_stats.png
"""
import argparse
import json
import math
import os

import torch

from bpe import BpeTokenizer
from reference_cpu import Llama


def window_stats(model, ids, skip):
    """Per layer: [outlier ratio, channels over 4x median, sink mass, normalized entropy] of one window."""
    rows = {}

    def observe(layer, k, probs):
        T = probs.shape[-1]
        channel_rms = k[:, skip:, :].pow(2).mean(1).sqrt()                      # (KV heads, D)
        median = channel_rms.median(-1, keepdim=True).values
        ratio = (channel_rms.max(-1).values / median.squeeze(-1)).mean().item()
        over = (channel_rms > 4 * median).float().sum(-1).mean().item()
        p = probs[:, skip:, :]                                                  # (heads, T - skip, T)
        sink = p[..., 0].mean().item()
        visible = torch.arange(skip + 1, T + 1, dtype=torch.float32)
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)                 # (heads, T - skip)
        normalized = (entropy / torch.log(visible)).mean().item()
        rows[layer] = [ratio, over, sink, normalized]

    model.logits(ids, observe=observe)
    return [rows[layer] for layer in sorted(rows)]


def model_stats(model_dir, text, windows, context, skip):
    tok = BpeTokenizer(os.path.join(model_dir, "tokenizer.json"))
    model = Llama(model_dir)
    ids = tok.encode(text)
    bos = tok.specials["<|begin_of_text|>"]
    step = context - 1
    n = min(windows, len(ids) // step)
    per_window = [window_stats(model, [bos] + ids[k * step:(k + 1) * step], skip) for k in range(n)]
    layers = len(per_window[0])
    mean = [[sum(w[l][i] for w in per_window) / n for i in range(4)] for l in range(layers)]
    names = ["k_outlier_ratio", "k_channels_over_4x_median", "sink_mass", "normalized_entropy"]
    return {"model": os.path.basename(os.path.normpath(model_dir)), "windows": n, "context": context,
            "skip": skip, "layers": [dict(zip(names, row)) for row in mean]}


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("k_outlier_ratio", "K: largest / median channel RMS"),
              ("sink_mass", "attention mass on the first token"),
              ("normalized_entropy", "attention entropy / log(visible tokens)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.4))
    for ax, (key, title) in zip(axes, panels):
        for result in results:
            values = [layer[key] for layer in result["layers"]]
            ax.plot(range(len(values)), values, marker="o", label=result["model"])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--skip", type=int, default=64)
    ap.add_argument("--json", default="")
    ap.add_argument("--plot", default="")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    text = open(args.text).read()
    results = [model_stats(m, text, args.windows, args.context, args.skip) for m in args.models]
    for result in results:
        print("%s (%d windows of %d)" % (result["model"], result["windows"], result["context"]))
        print("layer  k_outlier_ratio  k_channels>4x  sink_mass  norm_entropy")
        for l, row in enumerate(result["layers"]):
            print("%5d  %15.2f  %13.2f  %9.3f  %12.3f" % (l, *row.values()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
