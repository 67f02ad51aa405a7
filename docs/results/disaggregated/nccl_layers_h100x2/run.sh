#!/usr/bin/env bash
# Sessions 19-20 (issue 24, two GPUs): a build before (its slimkv in /tmp/old, with its plugin beside it;
# session 20: main at e69aa1b, synchronous host copies) and after (build/release), alternating as
# BUILDS says (e.g. BUILDS="old new old"); JCT at 10 Gbit/s with 16K prompts, and each transfer's seconds as the
# prefill worker reports them. From the repository root; logs to $OUT.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
M=/tmp/llama3-8b-random
[ -f $M/config.json ] || python3 scripts/make_random_model.py --shape llama3-8b --dtype float16 --out $M > "$OUT/model.txt" 2>&1
for build in ${BUILDS}; do
  bin=$PWD/build/release/slimkv; [ $build = old ] && bin=/tmp/old/slimkv
  n=$((${n:-0} + 1))
  timeout 140 python3 bench/disagg_serving_benchmark.py --slimkv "$bin" --model $M --two-gpus \
    --text models/slimkv-llama-15m/heldout.txt --serve-args "--device cuda --kv-cache-bytes 10000000000" --one-at-a-time \
    --kv-bandwidth-gbps 10 --specs "dense:dtype=f16;hack:bits=2,pi=64" --rates 0.2 --num-requests 4 \
    --input-len 16384 --range-ratio 0.1 --output-len 64 --max-model-len 20000 --max-num-seqs 4 --rounds 1 --threads 2 \
    --json "$OUT/serving_10g_${n}_$build.json" > "$OUT/serving_10g_${n}_$build.txt" 2>&1; echo "serving $n $build rc=$?"
  grep "round 0" "$OUT/serving_10g_${n}_$build.txt"
done
