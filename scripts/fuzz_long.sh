#!/usr/bin/env bash
# The long fuzz run: every fuzz target for SECONDS each from its seed corpus (fuzz/corpus/<name>/, new
# inputs kept in BUILD_DIR/fuzz-work/<name>), then a table of executions per target. Any crash, leak,
# timeout or sanitizer report fails the run (the reproducer is left in BUILD_DIR/fuzz-work/).
# Usage: fuzz_long.sh BUILD_DIR SECONDS [TARGET...]   (BUILD_DIR: a -DSLIMKV_FUZZ=ON build, see Makefile)
set -uo pipefail
build_dir=$1 seconds=$2; shift 2
cd "$(dirname "$0")/.."
targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(ls fuzz/*_fuzz.cc | xargs -n1 basename | sed 's/\.cc$//')
fi
# A cmake build dir is brought up to date; a folder of prebuilt fuzz binaries is used as it is.
if [ -f "$build_dir/build.ninja" ]; then
  cmake --build "$build_dir" -j 2 --target "${targets[@]}" >/dev/null || { echo "fuzz_long: build failed"; exit 1; }
fi
failed=0
report="| target | seconds | executions | exec/s | result |\n|---|---|---|---|---|\n"
for t in "${targets[@]}"; do
  work=$build_dir/fuzz-work/$t
  mkdir -p "$work"
  log=$build_dir/fuzz-work/$t.log
  "$build_dir/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  result=clean
  if [ "$rc" -ne 0 ]; then result="FAILED (exit $rc, see $log)"; failed=1; fi
  report+="| $t | $seconds | ${runs:-?} | ${rate:-?} | $result |\n"
  echo "fuzz_long: $t: ${runs:-?} executions in ${seconds}s: $result"
done
printf "%b" "$report"
exit $failed
