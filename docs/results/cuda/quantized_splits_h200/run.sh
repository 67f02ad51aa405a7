#!/usr/bin/env bash
# The quantized decode kernel by splits (docs/cuda.md, "Splits of the quantized decode kernel"): three calls
# on one H200 (2026-11-28, binaries of main a388361; device.txt of each in the session's note), into $OUT.
# Binaries in build/release; the step tracer needs CUPTI (/usr/local/cuda/extras/CUPTI/lib64).
set -uo pipefail
B=build/release
case ${1:-} in
trace)  # trace_*.txt: where a 16K decode step's time goes, dense 1 sequence, 2-bit 1 / 5 / 8
  for c in "dense 1" "hack 1" "hack 5" "hack 8"; do set -- $c
    SLIMKV_TRACE_OUT=/tmp/t.csv LD_PRELOAD=$PWD/$B/libslimkv_step_trace.so $B/bench_decode_e2e_cuda --random llama3-8b \
      --kvs $1 --bits 2 --batches $2 --prompt 16384 --steps 24 > /dev/null
    python3 bench/cuda/step_trace_summary.py /tmp/t.csv 16 > "$OUT/trace_$1_$2.txt"; done ;;
ncu)  # ncu_*_b5_16k.txt: the kernel at batch 5 alone and inside a step
  S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
  ncu -k regex:quantized_attent --launch-skip 10 --launch-count 1 $S $B/bench_decode_attention_cuda --kv hack --bits 2 \
    --batch 5 --contexts 16384 --repetitions 20 > "$OUT/ncu_bench_b5_16k.txt"
  ncu -k regex:quantized_attent --launch-skip 400 --launch-count 1 $S $B/bench_decode_e2e_cuda --random llama3-8b --kvs hack \
    --bits 2 --batches 5 --prompt 16384 --steps 16 > "$OUT/ncu_e2e_b5_16k.txt" ;;
splits)  # kernel_by_splits.txt, e2e_by_splits.txt: ran with a temporary patch (not kept) that divided the wave
  # the decode kernels split a sequence over by $SLIMKV_SPLIT_DIV (dense's too: its e2e rows at div > 1 are
  # not dense's rule); the `splits` column of each row says how many its sequences got.
  for d in 1 2 4 8 16; do for kv in hack dense; do for b in 1 5 8; do echo "div $d"
    SLIMKV_SPLIT_DIV=$d $B/bench_decode_attention_cuda --kv $kv --bits 2 --batch $b --contexts 4096 16384 65536 --repetitions 30 | tail -3
  done; done; done > "$OUT/kernel_by_splits.txt"
  for d in 1 4 8; do echo "div $d"; SLIMKV_SPLIT_DIV=$d $B/bench_decode_e2e_cuda --random llama3-8b --kvs dense,hack --bits 2 \
    --batches 1,5,8 --prompt 16384 --steps 24 | grep -v "^#"; done > "$OUT/e2e_by_splits.txt" ;;
*) echo "usage: run.sh trace|ncu|splits" >&2; exit 2 ;;
esac
