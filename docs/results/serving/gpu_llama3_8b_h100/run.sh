#!/usr/bin/env bash
# One device call (issue 22, CUDA): slimkv serve on a random-weight Llama-3-8B-shaped model.
#  A/B: dense vs hack:bits=2 in the same KV memory (--kv-cache-bytes 8e9), 16K-token prompts, 1024-token
#       outputs, all requests at once: most requests running at once, request throughput, TTFT/TPOT.
#  C:   a 32K-token prompt whose dense KV (4.3 GB) exceeds a 2 GB GPU budget: refused by dense, served by
#       dense@offload and hack:bits=2@offload.
set -uo pipefail
root=$PWD; w=$root/.gpurun
(cd "$w" && tar -xJf gpurun.tar.xz)
export LD_LIBRARY_PATH=$w/lib:${LD_LIBRARY_PATH:-} XDG_CACHE_HOME=/tmp/xdg
{ nvidia-smi -L; date -u; git -C "$root" log -1 --format=%h 2>/dev/null; } | tee "$OUT/device.txt"
M=/tmp/llama3-8b-random
t0=$(date +%s); python3 scripts/make_random_model.py --shape llama3-8b --out $M 2>&1 | tail -2
echo "model generated in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/device.txt"
serve() {  # serve LABEL PORT ARGS...: starts a server, waits for /health
  local label=$1 port=$2; shift 2
  "$w/bin/slimkv" serve --device cuda --model $M --port $port "$@" > "$OUT/serve_$label.log" 2>&1 &
  for i in $(seq 240); do curl -sf 127.0.0.1:$port/health >/dev/null && return 0; sleep 0.5; done
  echo "server $label did not come up"; return 1
}
bench() {  # bench LABEL PORT N: 16K prompts, 1024 outputs, all at once
  timeout 200 python3 bench/serving_benchmark.py --url http://127.0.0.1:$2 --num-prompts $3 --input-len 16384 \
    --output-len 1024 --range-ratio 0 --vocab-high 128000 --label "$1" --json "$OUT/bench_$1.json" 2>&1 \
    | tee "$OUT/bench_$1.txt" | grep -E "Result|Successful|Failed|duration|Request throughput|Output token|at once|Peak KV|Mean TTFT|Mean TPOT|P99 TPOT|error"
}
stop() { pkill -TERM -f "slimkv serve" ; for i in $(seq 60); do pgrep -f "slimkv serve" >/dev/null || return 0; sleep 0.5; done; pkill -KILL -f "slimkv serve"; }
common=(--kv-cache-bytes 8000000000 --max-num-seqs 64 --max-model-len 17500 --prefill-chunk-tokens 4096)
t0=$(date +%s); serve dense 8021 --kv dense "${common[@]}" && echo "load $(( $(date +%s) - t0 )) s" && bench dense 8021 16; stop
grep -E "KV|blocks|budget" "$OUT/serve_dense.log" | head -3
serve hack2 8022 --kv hack:bits=2 "${common[@]}" && bench hack2 8022 32; stop
grep -E "KV|blocks|budget" "$OUT/serve_hack2.log" | head -3
# C: admission beyond the GPU's KV budget
python3 - > /tmp/long.json <<'PY'
import json, random
r = random.Random(1)
print(json.dumps({"prompt": [r.randrange(10, 128000) for _ in range(32768)], "max_tokens": 16, "temperature": 0, "ignore_eos": True}))
PY
for kv in dense dense@offload hack:bits=2@offload; do
  serve offload 8023 --kv $kv --kv-cache-bytes 2000000000 --max-num-seqs 2 --max-model-len 40000 --prefill-chunk-tokens 4096 || { stop; continue; }
  result=$(curl -s -m 120 -o /tmp/long_out.json -w "HTTP %{http_code} in %{time_total} s" -H "Content-Type: application/json" --data-binary @/tmp/long.json 127.0.0.1:8023/v1/completions)
  echo "C: --kv $kv, 32768-token prompt, GPU KV budget 2 GB: $result: $(head -c 300 /tmp/long_out.json)" | tee -a "$OUT/admission.txt"
  stop
done
