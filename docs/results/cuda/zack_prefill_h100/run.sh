#!/usr/bin/env bash
# Issue 26: ZACK's prefill on the tensor-core tile (one H100, 2026-11-27, merged main 0722e7c); the "before" file
# is the same e2e command on main 0f6aa13 earlier that day (the decode kernel serving prefill too).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; B=build/release
$B/bench_decode_e2e_cuda --random llama3-8b --kvs dense,zack,zack+hack --bits 4 --zack-rate 0.5 --batches 1 --prompt 32768 \
  --steps 8 > "$OUT/bench_zack_ttft_32k.txt" 2>&1
$B/bench_zack_attention_cuda --batch 1 --queries 512 --contexts 16384,65536 --compressions 0.5 > "$OUT/bench_zack_prefill.txt" 2>&1
