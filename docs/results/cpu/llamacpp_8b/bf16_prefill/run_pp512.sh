#!/bin/bash
# 8B-shaped pp512 (2 of 32 layers, random BF16): llama.cpp and one slimkv build with each prefill GEMM
# tier forced through SLIMKV_BF16_GEMM (backend/cpu/bf16_gemm.h): avx512-bf16 (what an AMD EPYC runs),
# none (panel_gemm, FP32 FMAs: what this tier replaces there) and amx (what this Intel VM runs), alternating
# in each round (order rotated), 2 threads.
# slimkv_bench (the peers' llama-bench protocol, /work/shared/peers/llamacpp/slimkv_bench.cc) linked by
# /work/speed/build_sb.sh against this branch's build/release/libslimkv_core.a into /tmp/bf16_sb.
# Run as scripts/quiet_run.py run_pp512.sh (every other process paused); the jsonl files here are its
# output (R=...), summarized by ../amx_prefill/summarize.py.
set -u
R=${R:-/tmp/bf16_res/pp}; mkdir -p $R; ROUNDS=${ROUNDS:-3}
M8=/work/gguf-big/llama3-8b-2l-plainrope; G8=/work/gguf-big/llama3-8b-2l-F16.gguf
LB=/work/gguf-big/llama.cpp/build/bin/llama-bench
busy() { echo "$(date -Is) $1 loadavg: $(cat /proc/loadavg)" >> $R/speed_log.txt; }
llama() { busy "llama round $1"; $LB -m $G8 -p 512 -n 0 -d 0 -fa 1 -t 2 -r 2 -o jsonl 2>>$R/llama.err | sed "s/^{/{\"round\": $1, \"model\": \"8b\", /" >> $R/llama_bench.jsonl; }
slim() { busy "slimkv $2 round $1"; SLIMKV_BF16_GEMM=$2 /tmp/bf16_sb --model $M8 --kv dense:dtype=f16 --pp 512 --tg 0 --depth 0 --reps 2 --threads 2 2>>$R/slimkv.err | grep '"n_prompt":512' | sed "s/^{/{\"round\": $1, \"build\": \"$2\", \"model\": \"8b\", /" >> $R/slimkv_bench.jsonl; }
for r in $(seq $ROUNDS); do
  case $((r % 3)) in
    1) llama $r; slim $r avx512-bf16; slim $r none; slim $r amx;;
    2) slim $r avx512-bf16; slim $r none; slim $r amx; llama $r;;
    0) slim $r none; llama $r; slim $r amx; slim $r avx512-bf16;;
  esac
done
busy done
