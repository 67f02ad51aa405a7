#!/usr/bin/env bash
# Device call (issues 23/24, branch gpu-transport), cut to the session's last minutes of device time:
# the CUDA tests of the KV export/import paths (the two-process CUDA IPC round trip among them), the
# disaggregated serving test on the GPU over CUDA IPC and over TCP (bundled model), and the transport
# benchmark on the Llama-3-8B KV shape (16K, 32K tokens, one transfer each).
# Binaries and the branch's scripts come packed in gpurun.tar.xz (the call ships main's checkout).
set -uo pipefail
root=$PWD; w=$root/.gpurun-gpu-transport
source "$w/common.sh"
timeout 120 "$w/bin/slimkv_cuda_tests" --gtest_filter='KvIpc*:KvDeviceImport*:CudaEngine*' > "$OUT/cuda_tests.txt" 2>&1
echo "cuda tests rc=$?"
grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests from .* ran" "$OUT/cuda_tests.txt" | tail -8
grep -E "Failure|error:|Expected|Which is|actual" "$OUT/cuda_tests.txt" | head -20
for transport in auto tcp; do disagg disagg_bundled.txt 100 --kv-transport $transport; done
bench bench_kv_transport_16k_32k.txt 150 --prompt-tokens 16384,32768 --repeats 1
