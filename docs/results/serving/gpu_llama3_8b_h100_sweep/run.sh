#!/usr/bin/env bash
# One device call (issue 22, CUDA): a regime sweep of slimkv serve on a random-weight Llama-3-8B-shaped
# model (plan.json beside this script): dense vs hack:bits=2 (and hack:bits=4) in 8 GB and 4 GB of KV,
# 16K-token prompts with 1,024 or 2,048 output tokens, prefill chunks (the per-step token budget) of 256,
# 512 and 2,048 tokens, all requests at once and Poisson arrivals at 3x dense's measured throughput.
# The bundle (bin/slimkv, its .so files, the bench and model scripts of the commit in commit.txt) is
# unpacked from bundle.tar.xz; everything ends within SWEEP_S (default 420) s of the call (bench/serving_sweep.py's deadline).
set -uo pipefail
begin=$(date +%s)
w=$(cd "$(dirname "$0")" && pwd)
(cd "$w" && tar -xJf bundle.tar.xz --exclude=./plan.json)  # plan.json lies beside the bundle
export LD_LIBRARY_PATH=$w/lib:${LD_LIBRARY_PATH:-} XDG_CACHE_HOME=/tmp/xdg
{ nvidia-smi -L; nproc; date -u; cat "$w/commit.txt"; } | tee "$OUT/device.txt"
M=/tmp/llama3-8b-random
t0=$(date +%s)
# FP16 weights: the GPU computes in FP16 either way, and an FP16 checkpoint loads without a conversion.
python3 "$w/scripts/make_random_model.py" --shape llama3-8b --dtype float16 --out $M 2>&1 | tail -1
echo "model generated in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/device.txt"
python3 "$w/bench/serving_sweep.py" --slimkv "$w/bin/slimkv" --model $M --out "$OUT/sweep" --plan "$w/plan.json" \
  --serve-args "--device cuda --max-num-seqs 64 --max-model-len 18500" \
  --bench-args "--input-len 16384 --range-ratio 0 --vocab-high 128000 --timeout-s 300" \
  --deadline-s $(( ${SWEEP_S:-420} - ($(date +%s) - begin) )) 2>&1 | tee "$OUT/sweep.txt"
