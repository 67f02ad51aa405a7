#!/usr/bin/env bash
# Device call (session 15, issue 23): JCT on one H100 at 10 Gbit/s, after the fix that keeps two workers of one GPU
# off NCCL (the receiver declines an NCCL offer from its own GPU): colocated vs 1P+1D FP16 vs 1P+1D 2-bit, 16K prompts.
set -uo pipefail
root=$PWD; w=$root/.gpurun15
(cd "$w" && rm -rf bin lib && tar -xJf pkg.tar.xz)
export XDG_CACHE_HOME=/tmp/xdg LD_LIBRARY_PATH=$w/lib:${LD_LIBRARY_PATH:-}
{ nvidia-smi -L; date -u; } 2>&1 | tee "$OUT/device.txt"
M=/tmp/llama3-8b-random
[ -f $M/config.json ] || python3 scripts/make_random_model.py --shape llama3-8b --dtype float16 --out $M > "$OUT/model.txt" 2>&1
timeout 400 python3 bench/disagg_serving_benchmark.py --slimkv "$w/bin/slimkv" --model $M \
  --text models/slimkv-llama-15m/heldout.txt --serve-args "--device cuda --kv-cache-bytes 10000000000" --one-at-a-time \
  --kv-bandwidth-gbps 10 --specs "dense:dtype=f16;hack:bits=2,pi=64" --rates 0.2 --num-requests 4 \
  --input-len 16384 --range-ratio 0.1 --output-len 64 --max-model-len 20000 --max-num-seqs 4 --rounds 1 --threads 2 \
  --calibrate --calibration-repeats 1 --json "$OUT/serving_10g.json" > "$OUT/serving_10g.txt" 2>&1; echo "serving rc=$?"
tail -30 "$OUT/serving_10g.txt"
