#!/bin/bash
# 8B-shaped pp512 with hack:bits=2,pi=64 KV: slimkv this branch (amx) and main (base), alternating.
set -u
R=${R:-/tmp/pf8b_res/hack}; mkdir -p $R; M8=/work/gguf-big/llama3-8b-2l-plainrope
busy() { echo "$(date -Is) $1 loadavg: $(cat /proc/loadavg)" >> $R/speed_log.txt; }
slim() { busy "slimkv-$2 round $1"; /tmp/pf8b_sb_$2 --model $M8 --kv hack:bits=2,pi=64 --pp 512 --tg 0 --depth 0 --reps 2 --threads 2 2>>$R/slimkv.err | grep '"n_prompt":512' | sed "s/^{/{\"round\": $1, \"build\": \"$2\", \"model\": \"8b\", /" >> $R/slimkv_bench.jsonl; }
slim 1 amx; slim 1 base; slim 2 base; slim 2 amx
busy done
