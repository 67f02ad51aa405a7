#!/bin/bash
# 8B-shaped pp512 (2 of 32 layers, random BF16) and the bundled model's pp512: llama.cpp, slimkv with the
# AMX prefill (this branch) and slimkv main, alternating in each round (order rotated), 2 threads.
# slimkv_bench (the peers' llama-bench protocol, /work/shared/peers/llamacpp/slimkv_bench.cc) linked by
# /work/speed/build_sb.sh: /tmp/pf8b_sb_amx against branch prefill-8b at 5c1ebdd (AMX prefill),
# /tmp/pf8b_sb_base against main at 7022eae (no source change since the branch point 72b0185).
# Run as scripts/quiet_run.py run_....sh (every other process paused); pp512 files here are its output
# (R=...), summarized by summarize.py.
set -u
R=${R:-/tmp/pf8b_res/pp}; mkdir -p $R; ROUNDS=${ROUNDS:-3}
M8=/work/gguf-big/llama3-8b-2l-plainrope; G8=/work/gguf-big/llama3-8b-2l-F16.gguf
M15=/work/wt/prefill-8b/models/slimkv-llama-15m; G15=/work/gguf-big/slimkv-llama-15m-F16.gguf
LB=/work/gguf-big/llama.cpp/build/bin/llama-bench
busy() { echo "$(date -Is) $1 loadavg: $(cat /proc/loadavg)" >> $R/speed_log.txt; }
llama() { busy "llama $2 round $1"; $LB -m $3 -p 512 -n 0 -d 0 -fa 1 -t 2 -r $4 -o jsonl 2>>$R/llama.err | sed "s/^{/{\"round\": $1, \"model\": \"$2\", /" >> $R/llama_bench.jsonl; }
slim() { busy "slimkv-$2 $3 round $1"; /tmp/pf8b_sb_$2 --model $4 --kv dense:dtype=f16 --pp 512 --tg 0 --depth 0 --reps $5 --threads 2 2>>$R/slimkv.err | grep '"n_prompt":512' | sed "s/^{/{\"round\": $1, \"build\": \"$2\", \"model\": \"$3\", /" >> $R/slimkv_bench.jsonl; }
for r in $(seq $ROUNDS); do
  case $((r % 3)) in
    1) llama $r 8b $G8 2; slim $r amx 8b $M8 2; slim $r base 8b $M8 2;;
    2) slim $r amx 8b $M8 2; slim $r base 8b $M8 2; llama $r 8b $G8 2;;
    0) slim $r base 8b $M8 2; llama $r 8b $G8 2; slim $r amx 8b $M8 2;;
  esac
  llama $r 15m $G15 5; slim $r amx 15m $M15 5; slim $r base 15m $M15 5
done
busy done
