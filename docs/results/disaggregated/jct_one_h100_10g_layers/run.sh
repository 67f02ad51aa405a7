#!/usr/bin/env bash
# Issue 23: JCT on one H100 at 10 Gbit/s, the KV streamed layer by layer during the prefill's steps, colocated vs
# 1P+1D FP16 vs 1P+1D 2-bit, 16K prompts, and the simulator fed with this run's own measured costs (--calibrate:
# each spec's prefill and decode step costs on its own server; the GPU TCP host path from bench_kv_transport_cuda's
# uncapped `tcp` rows: export / stream / import seconds per transfer byte). From the repository root with
# build/release built (CUDA); logs to $OUT. Two device calls on one warm machine: `run.sh prepare` (the bench, the host
# path and the model), then `run.sh serve` with the first call's host_path.json copied into $OUT.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
w=$PWD/build/release
M=/tmp/llama3-8b-random
stage=${1:-all}
if [ "$stage" != serve ]; then
timeout 120 $w/bench_kv_transport_cuda --shape llama3-8b --specs "dense:dtype=f16;hack:bits=2,pi=64" --prompt-tokens 16384 \
  --transports cuda_ipc,tcp --repeats 2 > "$OUT/bench_kv_transport_tcp.txt" 2>&1; echo "transport rc=$?"
python3 - "$OUT/bench_kv_transport_tcp.txt" "$OUT/host_path.json" <<'PY'
import json, sys
specs = ["dense:dtype=f16", "hack:bits=2,pi=64"]  # the bench's rows come in this order, each named by its description
rows = []
for line in open(sys.argv[1]):
    f = line.split()  # spec tokens transport KV-MB export-ms stream-ms import-ms total-ms GB/s ratio
    if len(f) == 10 and f[1] == "16384" and f[2] == "tcp":
        rows.append({stage: float(f[i]) / 1e3 / (float(f[3]) * 1e6) for stage, i in (("export", 4), ("stream", 5), ("import", 6))})
json.dump(dict(zip(specs, rows)), open(sys.argv[2], "w"), indent=1)
PY
[ -f $M/config.json ] || python3 scripts/make_random_model.py --shape llama3-8b --dtype float16 --out $M > "$OUT/model.txt" 2>&1
fi
[ "$stage" = prepare ] && exit 0
timeout 585 python3 bench/disagg_serving_benchmark.py --slimkv "$w/slimkv" --model $M \
  --text models/slimkv-llama-15m/heldout.txt --serve-args "--device cuda --kv-cache-bytes 10000000000" --one-at-a-time \
  --kv-bandwidth-gbps 10 --specs "dense:dtype=f16;hack:bits=2,pi=64" --rates 0.2,0.5 --num-requests 6 \
  --input-len 16384 --range-ratio 0.1 --output-len 64 --max-model-len 20000 --max-num-seqs 4 --rounds 1 --threads 2 \
  --calibrate --calibration-repeats 1 --host-path-costs "$OUT/host_path.json" \
  --json "$OUT/serving_10g.json" > "$OUT/serving_10g.txt" 2>&1; echo "serving rc=$?"
tail -30 "$OUT/serving_10g.txt"
