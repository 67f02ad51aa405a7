#!/bin/bash
# Issue 30 at the 8B shape, deeper: pp512 @ d4096 and tg32 @ d8192, 3 rounds alternating llama.cpp and slimkv,
# 2 threads. Run from anywhere with llama.cpp 3f545bec built for the CPU (peers/llamacpp build flags) in
# /tmp/llama-cpu, slimkv_bench (peers/llamacpp/build_tools.sh against this commit's build/release) in /tmp,
# the 2-layer Llama-3-8B cut with plain RoPE in /tmp/l8p and its F16 GGUF (peers hf_llama_to_gguf.py).
set -u
R=${R:-/tmp/run8b_depth}; mkdir -p $R
LB=/tmp/llama-cpu/build/bin/llama-bench; SB=/tmp/slimkv_bench
for round in 0 1 2; do
  order="llama slimkv"; [ $((round % 2)) = 1 ] && order="slimkv llama"
  for e in $order; do
    if [ $e = llama ]; then
      $LB -m /tmp/llama3-8b-2l-F16.gguf -p 512 -n 0 -d 4096 -fa 1 -t 2 -r 2 -o jsonl >> $R/llama_pp.jsonl 2>/dev/null
      $LB -m /tmp/llama3-8b-2l-F16.gguf -p 0 -n 32 -d 8192 -fa 1 -t 2 -r 2 -o jsonl >> $R/llama_tg.jsonl 2>/dev/null
    else
      $SB --model /tmp/l8p --kv "dense:dtype=f16;hack:bits=2,pi=64" --pp 512 --tg 0 --depth 4096 --reps 2 --threads 2 >> $R/slimkv_pp.jsonl 2>/dev/null
      $SB --model /tmp/l8p --kv "dense:dtype=f16;hack:bits=2,pi=64" --pp 0 --tg 32 --depth 8192 --reps 2 --threads 2 >> $R/slimkv_tg.jsonl 2>/dev/null
    fi
    echo "round $round $e done $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a $R/load.txt
  done
done
