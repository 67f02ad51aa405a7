#!/bin/bash
# Run from anywhere with llama.cpp 3f545bec built for the CPU (peers/llamacpp build flags: GGML_NATIVE=OFF, AVX-512 F/BW/VL/VNNI/BF16) in /tmp/llama-cpu,
# slimkv_bench (peers/llamacpp) in /tmp, the 2-layer Llama-3-8B cut with plain RoPE in /tmp/l8p and its F16 GGUF (peers hf_llama_to_gguf.py).
# issue 30, 8B-2l shape: 3 rounds alternating llama.cpp and slimkv, pp512 @ d$PP_DEPTH (0) and tg32 @ d$TG_DEPTH
# (1024), 2 threads, $PP_REPS (3) repetitions of pp, 2 of tg (../depth_2026-11-28 runs it deeper)
set -u
R=${R:-/tmp/run8b}; mkdir -p $R
PP_DEPTH=${PP_DEPTH:-0} TG_DEPTH=${TG_DEPTH:-1024} PP_REPS=${PP_REPS:-3}
LB=/tmp/llama-cpu/build/bin/llama-bench; SB=/tmp/slimkv_bench
for round in 0 1 2; do
  order="llama slimkv"; [ $((round % 2)) = 1 ] && order="slimkv llama"
  for e in $order; do
    if [ $e = llama ]; then
      $LB -m /tmp/llama3-8b-2l-F16.gguf -p 512 -n 0 -d $PP_DEPTH -fa 1 -t 2 -r $PP_REPS -o jsonl >> $R/llama_pp.jsonl 2>/dev/null
      $LB -m /tmp/llama3-8b-2l-F16.gguf -p 0 -n 32 -d $TG_DEPTH -fa 1 -t 2 -r 2 -o jsonl >> $R/llama_tg.jsonl 2>/dev/null
    else
      $SB --model /tmp/l8p --kv "dense:dtype=f16;hack:bits=2,pi=64" --pp 512 --tg 0 --depth $PP_DEPTH --reps $PP_REPS --threads 2 >> $R/slimkv_pp.jsonl 2>/dev/null
      $SB --model /tmp/l8p --kv "dense:dtype=f16;hack:bits=2,pi=64" --pp 0 --tg 32 --depth $TG_DEPTH --reps 2 --threads 2 >> $R/slimkv_tg.jsonl 2>/dev/null
    fi
    echo "round $round $e done $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a $R/load.txt
  done
done
