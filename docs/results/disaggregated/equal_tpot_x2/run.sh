#!/usr/bin/env bash
# Equal TPOT at three times the request rate (issues 22 and 23), on two GPUs: dense FP16 KV against
# hack:bits=2,pi=64 at 3x dense's rate, Poisson arrivals, prompts of LEN tokens -> 1,024 tokens, a KV budget
# per server or worker that holds one dense sequence; each rate through a colocated server (GPU 0) and a
# prefill worker (GPU 0) + decode worker (GPU 1, KV by NCCL) behind slimkv router. Binaries in build/release
# (slimkv and libslimkv_cuda.so beside it); the random Llama-3-8B-shaped model is written on the device.
#   bash docs/results/disaggregated/equal_tpot_x2/run.sh 16384|32768 [dense|hack]   (into $OUT; one rate or both)
set -uo pipefail
len=$1 only=${2:-}
case $len in
  16384) kv=4000000000 ;;
  32768) kv=5000000000 ;;
  *) echo "LEN: 16384 or 32768, not '$len'" >&2; exit 2 ;;
esac
runs=("dense:dtype=f16 0.08 5" "hack:bits=2,pi=64 0.24 15")
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
M=/tmp/llama3-8b-random
[ -d $M ] || python3 scripts/make_random_model.py --shape llama3-8b --dtype float16 --out $M > "$OUT/model.txt" 2>&1
for run in "${runs[@]}"; do
  set -- $run
  [[ -n $only && $1 != $only* ]] && continue
  timeout 290 python3 bench/disagg_serving_benchmark.py --slimkv build/release/slimkv --model $M \
    --text models/slimkv-llama-15m/heldout.txt --two-gpus --input-len $len --range-ratio 0 --output-len 1024 \
    --max-model-len $((len + 2048)) --rounds 1 --kv-bandwidth-gbps 0 --threads 2 --timeout-s 240 --max-send-s 90 \
    --max-num-seqs 64 --serve-args "--device cuda --kv-cache-bytes $kv" --colocated-spec "$1" --specs "$1" \
    --rates $2 --num-requests $3 --json "$OUT/rate_$2.json" > "$OUT/rate_$2.txt" 2>&1
done
