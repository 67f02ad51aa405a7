#!/bin/bash
# 8B-shaped decode: tg32 after 1024 tokens, llama.cpp and slimkv (this branch, main), alternating, 2 threads.
# slimkv_bench (the peers' llama-bench protocol, /work/shared/peers/llamacpp/slimkv_bench.cc) linked by
# /work/speed/build_sb.sh: /tmp/pf8b_sb_amx against branch prefill-8b at 5c1ebdd (AMX prefill),
# /tmp/pf8b_sb_base against main at 7022eae (no source change since the branch point 72b0185).
# Run as scripts/quiet_run.py run_....sh (every other process paused); pp512 files here are its output
# (R=...), summarized by summarize.py.
set -u
R=${R:-/tmp/pf8b_res/tg}; mkdir -p $R; ROUNDS=${ROUNDS:-2}; DEPTH=${DEPTH:-1024}; BUILDS=${BUILDS:-amx base}
M8=/work/gguf-big/llama3-8b-2l-plainrope; G8=/work/gguf-big/llama3-8b-2l-F16.gguf
LB=/work/gguf-big/llama.cpp/build/bin/llama-bench
busy() { echo "$(date -Is) $1 loadavg: $(cat /proc/loadavg)" >> $R/speed_log.txt; }
llama() { busy "llama round $1"; $LB -m $G8 -p 0 -n 32 -d $DEPTH -fa 1 -t 2 -r 2 -o jsonl 2>>$R/llama.err | sed "s/^{/{\"round\": $1, \"model\": \"8b\", /" >> $R/llama_bench.jsonl; }
slim() { busy "slimkv-$2 round $1"; /tmp/pf8b_sb_$2 --model $M8 --kv dense:dtype=f16 --pp 0 --tg 32 --depth $DEPTH --reps 2 --threads 2 2>>$R/slimkv.err | grep '"n_gen":32' | sed "s/^{/{\"round\": $1, \"build\": \"$2\", \"model\": \"8b\", /" >> $R/slimkv_bench.jsonl; }
for r in $(seq $ROUNDS); do
  if [ $((r % 2)) -eq 1 ]; then llama $r; for b in $BUILDS; do slim $r $b; done
  else for b in $(echo $BUILDS | tr ' ' '\n' | tac); do slim $r $b; done; llama $r; fi
done
busy done
