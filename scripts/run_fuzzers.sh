#!/usr/bin/env bash
# Builds every fuzz target in BUILD_DIR and runs each briefly from its seed corpus.
# A crash, leak or sanitizer report fails the run. Usage: run_fuzzers.sh BUILD_DIR JOBS [SECONDS]
set -euo pipefail
build_dir=$1 jobs=${2:-2} seconds=${3:-20}
cd "$(dirname "$0")/.."
targets=$(ls fuzz/*_fuzz.cc 2>/dev/null | xargs -rn1 basename | sed 's/\.cc$//')
[ -n "$targets" ] || { echo "run_fuzzers: no fuzz targets"; exit 0; }
cmake --build "$build_dir" -j "$jobs" --target $targets
for t in $targets; do
  seeds=fuzz/corpus/$t
  work=$build_dir/fuzz-work/$t
  mkdir -p "$work"
  echo "run_fuzzers: $t for ${seeds} ${seconds}s"
  "$build_dir/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    "$work" "$seeds" 2>&1 | tail -n 12
done
echo "run_fuzzers: all targets ran clean"
