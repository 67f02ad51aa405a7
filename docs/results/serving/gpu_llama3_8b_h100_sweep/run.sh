#!/usr/bin/env bash
# One device call (issue 22, CUDA): a regime sweep of slimkv serve on a random-weight Llama-3-8B-shaped model
# (PLAN beside this script: plan_16k.json or plan_32k.json): dense vs hack:bits=2 in the same KV memory, all
# requests at once or Poisson arrivals at 3x dense's measured throughput. The bundle (bin/slimkv and
# libslimkv_cuda.so, stripped, plus lib/ with the libraries the GPU host lacks) is unpacked from pkg.tar.xz
# beside this script; the bench and model scripts are the tree's. Everything ends within SWEEP_S seconds.
#   PLAN=plan_32k.json MAXLEN=34500 SWEEP_S=360 bash docs/results/serving/gpu_llama3_8b_h100_sweep/run.sh
set -uo pipefail
begin=$(date +%s)
root=$PWD; w=$(cd "$(dirname "$0")" && pwd)
(cd "$w" && rm -rf bin lib && tar -xJf pkg.tar.xz)
export XDG_CACHE_HOME=/tmp/xdg LD_LIBRARY_PATH=$w/lib:${LD_LIBRARY_PATH:-}
{ nvidia-smi -L; date -u; git -C "$root" log -1 --format='main at %h'; } 2>&1 | tee "$OUT/device.txt"
M=/tmp/llama3-8b-random
# FP16 weights: the GPU computes in FP16 either way, and an FP16 checkpoint loads without a conversion.
python3 scripts/make_random_model.py --shape llama3-8b --dtype float16 --out $M > "$OUT/model.txt" 2>&1
python3 bench/serving_sweep.py --slimkv "$w/bin/slimkv" --model $M --out "$OUT/sweep" --plan "$w/${PLAN:-plan_16k.json}" \
  --serve-args "--device cuda --max-num-seqs 64 --max-model-len ${MAXLEN:-18500}" \
  --bench-args "--input-len 16384 --range-ratio 0 --vocab-high 128000 --timeout-s 300" \
  --deadline-s $(( ${SWEEP_S:-470} - ($(date +%s) - begin) )) > "$OUT/sweep.txt" 2>&1
grep -v "^note" "$OUT/sweep.txt" | tail -14
