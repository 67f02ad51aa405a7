#!/bin/bash
# CPU decode speed of slimkv beside llama.cpp on the same GGUF files, and slimkv's load time and
# resident memory (bench/bench_gguf.cc), in alternating rounds (order flipped every round, so a
# neighbour's load on a shared machine falls on both engines alike).
#   TOOLS=<folder with llama-bench (scripts/gguf/build_llama_tools.sh)> SLIMKV_BIN=build/release \
#   ROUNDS=3 THREADS=2 bench/gguf_speed.sh FILE.gguf [FILE.gguf | MODEL_DIR ...] > results.md
# Prints a JSON line per engine, model and round, then a table of each model's median decode tokens/s
# per engine and their ratio (results in docs/models.md, "Measured: decode speed beside llama.cpp").
# llama-bench's tg test: N single-token decode steps after an empty context (-p 0 -n N); slimkv's:
# N decode steps after a 16-token prompt. One slimkv process per model, so each RSS is its own.
set -eu
TOOLS=${TOOLS:?folder with llama-bench}
SLIMKV_BIN=${SLIMKV_BIN:-build/release}
ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-2} DECODE=${DECODE:-32}
records=$(mktemp)
trap 'rm -f "$records"' EXIT
echo "# $(date -u +%FT%TZ) $(uname -n) commit $(git rev-parse --short HEAD 2>/dev/null) loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  for model in "$@"; do
    run_llama() {
      [[ $model == *.gguf ]] || return 0
      "$TOOLS/llama-bench" -m "$model" -p 0 -n "$DECODE" -t "$THREADS" -r 1 -o jsonl 2>/dev/null |
        sed "s|^{|{\"engine\": \"llama.cpp\", \"round\": $round, |"
    }
    run_slimkv() {
      "$SLIMKV_BIN/bench_gguf" --model "$model" --threads "$THREADS" --decode "$DECODE" --json | grep '^{' |
        sed "s|^{|{\"engine\": \"slimkv\", \"round\": $round, |"
    }
    if ((round % 2)); then run_llama; run_slimkv; else run_slimkv; run_llama; fi
  done | tee -a "$records"
done
python3 - "$records" "$THREADS" <<'EOF'
import json, statistics, sys
rates = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rate = r["avg_ts"] if r["engine"] == "llama.cpp" else r["decode_tok_s"]
    model = r["model_filename"] if r["engine"] == "llama.cpp" else r["model"]
    rates.setdefault(model, {}).setdefault(r["engine"], []).append(rate)
print(f"\nDecode tokens/s, {sys.argv[2]} threads, median over rounds:\n")
print("| model | llama.cpp | slimkv | slimkv / llama.cpp | rounds |")
print("|---|---:|---:|---:|---:|")
for model, by_engine in rates.items():
    llama = statistics.median(by_engine["llama.cpp"]) if "llama.cpp" in by_engine else None
    slim = statistics.median(by_engine["slimkv"]) if "slimkv" in by_engine else None
    ratio = f"{slim / llama:.2f}" if llama and slim else ""
    fmt = lambda v: f"{v:.1f}" if v is not None else ""
    print(f"| {model} | {fmt(llama)} | {fmt(slim)} | {ratio} | {len(next(iter(by_engine.values())))} |")
EOF
