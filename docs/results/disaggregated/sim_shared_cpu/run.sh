#!/usr/bin/env bash
# The simulator's shared-device model against this 2-core CPU (helper simshared, issue 23): each deployment's
# workers on the same two cores, the calibration (each spec's costs, the host path) in the same run, other
# engineers' niced builds paused (scripts/quiet_run.py). Run from the repository root after
# `ninja -C build/release slimkv bench_kv_host_path`. --threads 1: the two workers' threads fit the cores
# (device_share 1); --threads 2: they share them (device_share 0.5).
#   capped: the KV link at 20 Mbit/s, 512-token prompts (the earlier CPU comparison's regime: transfer-bound);
#   busy:   1 Gbit/s, 2048-token prompts, 128-token outputs, prefills landing while others decode.
# THREADS="2" runs only those (a run that an un-niced build elsewhere overlapped is run again).
set -u
dir=docs/results/disaggregated/sim_shared_cpu
for t in ${THREADS:-1 2}; do
  { echo "--threads $t"; date -u; git rev-parse --short HEAD; lscpu | grep -E "Model name|^CPU\(s\)"; uptime; } >> $dir/machine.txt
  python3 scripts/quiet_run.py python3 bench/disagg_serving_benchmark.py --slimkv build/release/slimkv \
    --kv-bandwidth-gbps 0.02 --specs "dense:dtype=f16;hack:bits=2,pi=64" --rates 0.3,2 --num-requests 8 \
    --input-len 512 --output-len 64 --rounds 2 --threads $t --calibrate --calibration-repeats 3 \
    --json $dir/capped_t$t.json > $dir/capped_t$t.txt 2>&1
  echo "capped t=$t rc=$?"
  python3 scripts/quiet_run.py python3 bench/disagg_serving_benchmark.py --slimkv build/release/slimkv \
    --kv-bandwidth-gbps 1 --specs "dense:dtype=f16;hack:bits=2,pi=64" --rates 1,3 --num-requests 12 \
    --input-len 2048 --output-len 128 --rounds 2 --threads $t --calibrate --calibration-repeats 3 \
    --json $dir/busy_t$t.json > $dir/busy_t$t.txt 2>&1
  echo "busy t=$t rc=$?"
  uptime >> $dir/machine.txt
done
