#!/usr/bin/env bash
# Device call (2 GPUs, issue 24): the KV stream's NCCL path — device-path tests (CUDA IPC and NCCL),
# disaggregated serving with the decode worker on the second GPU, the transfer bench over NCCL (capped
# and not), and colocated vs disaggregated serving of a Llama-3-8B-shaped model.
set -uo pipefail
root=$PWD; w=$root/.gpurun13
(cd "$w" && rm -rf bin lib && tar -xJf pkg.tar.xz)
export XDG_CACHE_HOME=/tmp/xdg LD_LIBRARY_PATH=$w/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
{ nvidia-smi -L; nvidia-smi topo -m; nproc; date -u; ldconfig -p | grep libnccl; } > "$OUT/device.txt" 2>&1
(python3 "$w/../scripts/make_random_model.py" --shape llama3-8b --dtype float16 --out /tmp/m8b > "$OUT/model.txt" 2>&1) &
gen=$!
cd "$w/bin"
timeout 150 ./slimkv_cuda_tests --gtest_filter='*KvIpc*:*KvDevice*' > "$OUT/kv_tests.txt" 2>&1; echo "kv tests rc=$?"
grep -E "^\[ +(FAILED|PASSED|SKIPPED) |tests from .* ran" "$OUT/kv_tests.txt" | tail -4
grep -E "Failure|Expected|Which|actual" "$OUT/kv_tests.txt" | head -10
cd "$root"
timeout 200 python3 tests/serve/disaggregated_test.py "$w/bin/slimkv" "$root" --device cuda --two-gpus > "$OUT/disagg_nccl.txt" 2>&1; echo "disagg nccl rc=$?"
tail -3 "$OUT/disagg_nccl.txt"
timeout 240 "$w/bin/bench_kv_transport_cuda" --two-gpus --shape llama3-8b --specs "dense:dtype=f16;hack:bits=4;hack:bits=2,pi=64" \
  --prompt-tokens 16384,32768,65536 --transports nccl,nccl@100,nccl@10 --repeats 3 > "$OUT/transport.txt" 2>&1; echo "bench rc=$?"
tail -30 "$OUT/transport.txt"
wait $gen; tail -1 "$OUT/model.txt"
timeout 200 python3 bench/disagg_serving_benchmark.py --slimkv "$w/bin/slimkv" --model /tmp/m8b \
  --text models/slimkv-llama-15m/heldout.txt --serve-args "--device cuda" --two-gpus --kv-bandwidth-gbps 0 \
  --specs "dense:dtype=f16;hack:bits=2,pi=64" --rates 2,4 --num-requests 16 --input-len 4096 --output-len 64 \
  --max-num-seqs 6 --rounds 1 --threads 2 --json "$OUT/serving.json" > "$OUT/serving.txt" 2>&1; echo "serving rc=$?"
tail -25 "$OUT/serving.txt"
