#!/usr/bin/env bash
# Issue 26: zack, zack+hack and their host tier end to end, and the zack+hack decode attention (one H100,
# 2026-11-27, main 0f6aa13; the 32K TTFT here is before ZACK's prefill kernel: zack_prefill_h100/ has it after).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; B=build/release
$B/bench_decode_attention_cuda --kv hack --bits 2 --contexts 4096,16384,65536 > "$OUT/bench_hack_decode.txt" 2>&1
$B/bench_zack_attention_cuda --batch 8 --contexts 4096,16384,65536 --compressions 0.3,0.5,0.7 --codec hack --codec-bits 4 > "$OUT/bench_zack_hack4.txt" 2>&1
$B/bench_zack_attention_cuda --batch 8 --contexts 16384,65536 --compressions 0.5 --codec hack --codec-bits 2 > "$OUT/bench_zack_hack2.txt" 2>&1
$B/bench_decode_e2e_cuda --random llama3-8b --kvs dense,zack,hack,zack+hack --bits 4 --zack-rate 0.5 --batches 1 --prompt 32768 --steps 8 > "$OUT/bench_ttft_32k.txt" 2>&1
$B/bench_decode_e2e_cuda --random llama3-8b --kvs dense,zack,hack,zack+hack --bits 4 --zack-rate 0.5 --fit --context 32768 --steps 16 > "$OUT/bench_fit_32k.txt" 2>&1
$B/bench_decode_e2e_cuda --random llama3-8b --kvs dense@offload,zack@offload,hack@offload --bits 4 --zack-rate 0.5 --batches 4 --context 16384 --steps 8 > "$OUT/bench_offload_16k.txt" 2>&1
