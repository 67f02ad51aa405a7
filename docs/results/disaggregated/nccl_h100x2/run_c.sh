#!/usr/bin/env bash
# Device call (2 GPUs, issue 24): colocated vs disaggregated serving of a Llama-3-8B-shaped model (decode
# worker on the second GPU, KV by NCCL), and the transfer bench's HACK rows over NCCL.
set -uo pipefail
root=$PWD; w=$root/.gpurun13
(cd "$w" && rm -rf bin lib && tar -xJf pkg.tar.xz)
export XDG_CACHE_HOME=/tmp/xdg LD_LIBRARY_PATH=$w/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
{ nvidia-smi -L; date -u; } > "$OUT/device.txt" 2>&1
(python3 "$root/scripts/make_random_model.py" --shape llama3-8b --dtype float16 --out /tmp/m8b > "$OUT/model.txt" 2>&1) &
gen=$!
timeout 90 "$w/bin/bench_kv_transport_cuda" --two-gpus --shape llama3-8b --specs "hack:bits=4;hack:bits=2,pi=64" \
  --prompt-tokens 16384,32768 --transports nccl,nccl@10 --repeats 3 > "$OUT/transport_hack.txt" 2>&1; echo "bench rc=$?"
tail -9 "$OUT/transport_hack.txt"
wait $gen; tail -1 "$OUT/model.txt"
timeout 230 python3 bench/disagg_serving_benchmark.py --slimkv "$w/bin/slimkv" --model /tmp/m8b \
  --text models/slimkv-llama-15m/heldout.txt --serve-args "--device cuda --kv-cache-bytes 6000000000" --two-gpus \
  --kv-bandwidth-gbps 0 --specs "dense:dtype=f16;hack:bits=2,pi=64" --rates 2,4 --num-requests 12 --input-len 4096 \
  --output-len 64 --max-num-seqs 6 --rounds 1 --threads 2 --json "$OUT/serving.json" > "$OUT/serving.txt" 2>&1; echo "serving rc=$?"
tail -28 "$OUT/serving.txt"
# Then, on the same warm machine, the 10 Gbit/s run (one command):
#   bench/disagg_serving_benchmark.py ... same options ... --kv-bandwidth-gbps 10 --json $OUT/serving_10g.json
