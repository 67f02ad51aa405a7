#!/bin/bash
# Run from anywhere with llama.cpp 3f545bec built for the CPU (peers/llamacpp build flags: GGML_NATIVE=OFF, AVX-512 F/BW/VL/VNNI/BF16) in /tmp/llama-cpu,
# slimkv_bench (peers/llamacpp) in /tmp, the 2-layer Llama-3-8B cut with plain RoPE in /tmp/l8p and its F16 GGUF (peers hf_llama_to_gguf.py).
# issue 30, 8B-2l shape: 3 rounds alternating llama.cpp and slimkv, pp512 @ d0 and tg32 @ d1024, 2 threads
set -u
R=${R:-/tmp/run8b}; mkdir -p $R
LB=/tmp/llama-cpu/build/bin/llama-bench; SB=/tmp/slimkv_bench
for round in 0 1 2; do
  order="llama slimkv"; [ $((round % 2)) = 1 ] && order="slimkv llama"
  for e in $order; do
    if [ $e = llama ]; then
      $LB -m /tmp/llama3-8b-2l-F16.gguf -p 512 -n 0 -d 0 -fa 1 -t 2 -r 3 -o jsonl >> $R/llama_pp.jsonl 2>/dev/null
      $LB -m /tmp/llama3-8b-2l-F16.gguf -p 0 -n 32 -d 1024 -fa 1 -t 2 -r 2 -o jsonl >> $R/llama_tg.jsonl 2>/dev/null
    else
      $SB --model /tmp/l8p --kv "dense:dtype=f16;hack:bits=2,pi=64" --pp 512 --tg 0 --depth 0 --reps 3 --threads 2 >> $R/slimkv_pp.jsonl 2>/dev/null
      $SB --model /tmp/l8p --kv "dense:dtype=f16;hack:bits=2,pi=64" --pp 0 --tg 32 --depth 1024 --reps 2 --threads 2 >> $R/slimkv_tg.jsonl 2>/dev/null
    fi
    echo "round $round $e done $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a $R/load.txt
  done
done
