#!/usr/bin/env bash
# Session 20 (issue 22, one GPU): prefill chunks small enough to ride on the decode steps. A decode step of
# the 8B shape streams its 16 GB of weights whatever its row count, so a step that carries a 64- or
# 128-token chunk beside the running sequences costs little more than one without; with 512-token chunks
# the prefill is compute-bound and every running sequence waits for it. Dense vs hack:bits=2 in 4 GB of KV
# (dense holds one 16K sequence), 16K prompts and 2,048 outputs, all requests at once. From the repository
# root with build/release built (CUDA); logs to $OUT; ends within SWEEP_S seconds.
set -uo pipefail
begin=$(date +%s)
w=$(cd "$(dirname "$0")" && pwd)
export XDG_CACHE_HOME=/tmp/xdg
M=/tmp/llama3-8b-random
[ -f $M/config.json ] || python3 scripts/make_random_model.py --shape llama3-8b --dtype float16 --out $M > "$OUT/model.txt" 2>&1
python3 bench/serving_sweep.py --slimkv "$PWD/build/release/slimkv" --model $M --out "$OUT/sweep" --plan "$w/plan.json" \
  --serve-args "--device cuda --max-num-seqs 64 --max-model-len 18500" \
  --bench-args "--input-len 16384 --range-ratio 0 --vocab-high 128000 --timeout-s 300" \
  --deadline-s $(( ${SWEEP_S:-470} - ($(date +%s) - begin) )) > "$OUT/sweep.txt" 2>&1
grep -v "^note" "$OUT/sweep.txt" | tail -14
