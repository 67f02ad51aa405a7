#!/usr/bin/env bash
# Issue 25: pq's quality on the GPU against the CPU path, with the settings of the CPU tables
# docs/results/pq_speed (ppl: 4 windows of 4096) and pq_speed/retrieval (pass key 1, kvret 4 samples a cell).
# cuda/ ran on one H100, cpu/ on the same machine's CPU at 8 threads (device.txt), 2026-11-28 at main c6f0812.
# From the repository root with build/release built (slimkv and libslimkv_cuda.so).
set -euo pipefail
OUT=${OUT:-out}
common=(--model models/slimkv-llama-15m --kv "dense,pq:topk=0.2,pq:topk=0.1" --tasks ppl,passkey,kvret
        --context 4096 --samples kvret=4,passkey=1,ppl=4 --seed 0 --filler text --no-plots)
build/release/slimkv eval "${common[@]}" --device cuda --out "$OUT/cuda"
build/release/slimkv eval "${common[@]}" --device cpu --threads 8 --out "$OUT/cpu"
