#!/usr/bin/env bash
# Runs bench/serving_benchmark.py against slimkv serve once per KV spec, one server at a time on
# loopback, and prints the runs side by side (ratios to the first spec). What docs/serving.md reports.
# Usage: bench/serving_kv_specs.sh SLIMKV_BINARY OUT_DIR [benchmark flags...]
#   e.g. bench/serving_kv_specs.sh build/release/slimkv /tmp/serving --num-prompts 32 --request-rate 2
# SPECS (default "dense;hack:bits=4;hack:bits=2,pi=64"), MODEL and SERVE_ARGS override the rest.
set -euo pipefail
slimkv=$1 out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
model=${MODEL:-$here/../models/slimkv-llama-15m}
IFS=';' read -ra specs <<<"${SPECS:-dense;hack:bits=4;hack:bits=2,pi=64}"
mkdir -p "$out"
for spec in "${specs[@]}"; do
  name=${spec//[:=,]/_}
  "$slimkv" serve --model "$model" --kv "$spec" --port 0 ${SERVE_ARGS:---max-num-seqs 16} >"$out/$name.log" 2>&1 &
  server=$!
  for _ in $(seq 1200); do grep -q "listening on" "$out/$name.log" && break; sleep 0.05; done
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$out/$name.log")
  for _ in $(seq 1200); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && break; sleep 0.1; done
  python3 "$here/serving_benchmark.py" --url "http://127.0.0.1:$port" --label "$spec" --json "$out/$name.json" "$@" \
    | tee "$out/$name.txt"
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^slimkv:(kv_cache_bytes_per_token|num_preemptions_total|kv_cache_capacity_bytes)' \
    >"$out/$name.metrics" || true
  kill -TERM $server
  wait $server
done
python3 - "$out" "${specs[@]}" <<'PY'
import json, sys
out, specs = sys.argv[1], sys.argv[2:]
runs = [json.load(open(f"{out}/{s.replace(':', '_').replace('=', '_').replace(',', '_')}.json")) for s in specs]
metrics = {}
for s in specs:
    for line in open(f"{out}/{s.replace(':', '_').replace('=', '_').replace(',', '_')}.metrics"):
        name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
        metrics.setdefault(s, {})[name] = value
rows = [("request throughput (req/s)", "request_throughput"), ("output throughput (tok/s)", "output_throughput"),
        ("mean TTFT (ms)", "mean_ttft_ms"), ("p99 TTFT (ms)", "p99_ttft_ms"), ("mean TPOT (ms)", "mean_tpot_ms"),
        ("p99 ITL (ms)", "p99_itl_ms"), ("mean e2e (ms)", "mean_e2el_ms"), ("failed requests", "errors")]
print("| | " + " | ".join(specs) + " |")
print("|---" * (len(specs) + 1) + "|")
for title, key in rows:
    base = runs[0][key]
    cells = [f"{r[key]:.2f}" + (f" ({r[key] / base:.2f}x)" if base and i else "") for i, r in enumerate(runs)]
    print(f"| {title} | " + " | ".join(cells) + " |")
print("| KV bytes per token | " + " | ".join(f"{metrics[s].get('slimkv:kv_cache_bytes_per_token', 0):.0f}" for s in specs) + " |")
print("| preemptions | " + " | ".join(f"{metrics[s].get('slimkv:num_preemptions_total', 0):.0f}" for s in specs) + " |")
PY
