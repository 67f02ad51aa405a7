#!/usr/bin/env bash
# One device call on two GPUs (issues 22 and 24): dense FP16 KV at 0.08 requests/s against hack:bits=2 at
# 3x that rate (0.24/s), Poisson arrivals, 16K-token prompts -> 1,024 tokens, 4 GB of KV per server or
# worker; each rate through a colocated server (GPU 0) and a prefill worker (GPU 0) + decode worker (GPU 1,
# KV by NCCL) behind slimkv router. Binaries in build/release (slimkv and libslimkv_cuda.so beside it).
#   bash docs/results/disaggregated/equal_tpot_h100x2/run.sh     (writes into $OUT)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
M=/tmp/llama3-8b-random
[ -d $M ] || python3 scripts/make_random_model.py --shape llama3-8b --dtype float16 --out $M > "$OUT/model.txt" 2>&1
for run in "dense:dtype=f16 0.08 5" "hack:bits=2,pi=64 0.24 15"; do
  set -- $run
  timeout 260 python3 bench/disagg_serving_benchmark.py --slimkv build/release/slimkv --model $M \
    --text models/slimkv-llama-15m/heldout.txt --two-gpus --input-len 16384 --range-ratio 0 --output-len 1024 \
    --max-model-len 18500 --rounds 1 --kv-bandwidth-gbps 0 --threads 2 --timeout-s 200 --max-send-s 70 --max-num-seqs 64 \
    --serve-args "--device cuda --kv-cache-bytes 4000000000" --colocated-spec "$1" --specs "$1" --rates $2 \
    --num-requests $3 --json "$OUT/rate_$2.json" > "$OUT/rate_$2.txt" 2>&1
done
# The step times beside (one process, no server): build/release/bench_decode_e2e_cuda --random llama3-8b \
#   --kvs dense,hack --bits 2 --batches 1,3,5,8 --prompt 16384 --steps 32 > "$OUT/e2e_16k.txt"
# The burst runs (all requests at once, before the ITL column existed): --rates 1000 --num-requests 6
#   --max-num-seqs 3 --specs "dense:dtype=f16;hack:bits=2,pi=64" (burst_cap3), and --max-num-seqs 5
#   --colocated-spec "hack:bits=2,pi=64" --specs "hack:bits=2,pi=64" (burst_cap5).
