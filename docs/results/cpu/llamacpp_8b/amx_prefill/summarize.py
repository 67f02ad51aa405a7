#!/usr/bin/env python3
"""summarize.py LLAMA_JSONL SLIMKV_JSONL: per engine (slimkv: per build), model and test, the median
tokens/s over every sample of every round, min, max and the per-round medians, as a markdown table."""
import json
import statistics
import sys

rows = {}
for path, engine in ((sys.argv[1], lambda d: "llama.cpp"), (sys.argv[2], lambda d: "slimkv " + d["build"])):
    for line in open(path):
        d = json.loads(line)
        test = f"pp{d['n_prompt']}" if d["n_gen"] == 0 else f"tg{d['n_gen']} @ d{d['n_depth']}"
        rows.setdefault((d["model"], test, engine(d)), {}).setdefault(d["round"], []).extend(d["samples_ts"])
print("| model | test | engine | samples | median | min | max | per-round medians |")
print("|---|---|---|---:|---:|---:|---:|---|")
for (model, test, engine), by_round in sorted(rows.items()):
    samples = [v for r in by_round.values() for v in r]
    per_round = "/".join(f"{statistics.median(by_round[r]):.1f}" for r in sorted(by_round))
    print(f"| {model} | {test} | {engine} | {len(samples)} | {statistics.median(samples):.1f} | {min(samples):.1f} | "
          f"{max(samples):.1f} | {per_round} |")
