#!/usr/bin/env bash
# Session 19 (issue 23): JCT on one H100 at 10 Gbit/s with the KV streamed layer by layer during the prefill's
# steps (was: sent after the last step): colocated vs 1P+1D FP16 vs 1P+1D 2-bit, 16K prompts (session 15's run).
# From the repository root with build/release built (CUDA); logs to $OUT.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
w=$PWD/build/release
M=/tmp/llama3-8b-random
[ -f $M/config.json ] || python3 scripts/make_random_model.py --shape llama3-8b --dtype float16 --out $M > "$OUT/model.txt" 2>&1
timeout 420 python3 bench/disagg_serving_benchmark.py --slimkv "$w/slimkv" --model $M \
  --text models/slimkv-llama-15m/heldout.txt --serve-args "--device cuda --kv-cache-bytes 10000000000" --one-at-a-time \
  --kv-bandwidth-gbps 10 --specs "dense:dtype=f16;hack:bits=2,pi=64" --rates 0.2 --num-requests 4 \
  --input-len 16384 --range-ratio 0.1 --output-len 64 --max-model-len 20000 --max-num-seqs 4 --rounds 1 --threads 2 \
  --json "$OUT/serving_10g.json" > "$OUT/serving_10g.txt" 2>&1; echo "serving rc=$?"
tail -30 "$OUT/serving_10g.txt"
