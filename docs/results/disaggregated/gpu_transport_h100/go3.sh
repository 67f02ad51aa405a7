#!/usr/bin/env bash
# Device call 2 (branch gpu-transport): the two-process CUDA IPC test (call 1's filter missed its
# Specs/ prefix) and the transport benchmark for the hack specs at 16K tokens.
set -uo pipefail
root=$PWD; w=$root/.gpurun-gpu-transport
source "$w/common.sh"
timeout 90 "$w/bin/slimkv_cuda_tests" --gtest_filter='*KvIpc*' > "$OUT/cuda_ipc_tests.txt" 2>&1
echo "cuda tests rc=$?"
grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |tests from .* ran" "$OUT/cuda_ipc_tests.txt" | tail -12
grep -E "Failure|error:|Expected|Which is|actual" "$OUT/cuda_ipc_tests.txt" | head -10
timeout 100 "$w/bin/bench_kv_transport_cuda" --shape llama3-8b --specs "hack:bits=2,pi=64;hack:bits=4" --prompt-tokens 16384 \
  --transports cuda_ipc,tcp,tcp@100,tcp@10 --repeats 1 2>&1 | tee "$OUT/bench_kv_transport_hack_16k.txt"
