#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the CUDA tests, compute-sanitizer (memcheck, racecheck) over them,
# and decode attention (dense FP16, quant 2-bit, hack 2-bit) against PyTorch SDPA in the same run
# (needs python3 with torch).
#   scripts/cuda_check.sh [BUILD_DIR=build/release] [LOG_DIR=.]
set -uo pipefail
build="${1:-build/release}"
logs="${2:-.}"
here="$(cd "$(dirname "$0")/.." && pwd)"
status=0
echo "== CUDA tests"
"$build/slimkv_cuda_tests" 2>&1 | tee "$logs/cuda_tests.log" | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) " || status=1
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool"
  # racecheck over the kernels' tests (over whole models it runs for many minutes)
  filter=$([ "$tool" = racecheck ] && echo "--gtest_filter=CudaTest.*:CudaLayerTest.*" || echo "")
  compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/slimkv_cuda_tests" $filter > "$logs/cuda_$tool.log" 2>&1 || status=1
  tail -1 "$logs/cuda_$tool.log"
done
echo "== decode attention vs SDPA"
python3 "$here/bench/cuda/decode_attention_vs_sdpa.py" --slimkv "$build/bench_decode_attention_cuda" \
  --kvs dense,quant,hack --bits 2 2>&1 |
  tee "$logs/cuda_bench.log" || status=1
exit $status
