#!/usr/bin/env bash
# Issue 25: pq's quality on the GPU against the CPU path, the same command and defaults (context 8192, ppl 4
# windows, pass key 2 and kvret 8 samples a cell). cuda/ ran on one H100 (device.txt), cpu/ on the 2-core
# Xeon dev VM (--threads 2), both 2026-11-27 at main 0f6aa13. From the repository root with build/release built.
set -euo pipefail
OUT=${OUT:-out}
build/release/slimkv eval --model models/slimkv-llama-15m --device cuda --kv "dense,pq:topk=0.2,pq:topk=0.1" \
  --tasks ppl,passkey,kvret --no-plots --out "$OUT/cuda"
build/release/slimkv eval --model models/slimkv-llama-15m --kv "dense,pq:topk=0.2,pq:topk=0.1" \
  --tasks ppl,passkey,kvret --no-plots --threads 2 --out "$OUT/cpu"
