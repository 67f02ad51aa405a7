#!/usr/bin/env bash
# Runs fuzz targets from their seed corpora (fuzz/corpus/<name>/; new inputs kept in
# BUILD_DIR/fuzz-work/<name>/), JOBS targets at a time, each for SECONDS, then prints a table of
# executions per target. Any crash, leak, timeout or sanitizer report fails the run; its log and
# reproducer are left in BUILD_DIR/fuzz-work/.
# Usage: run_fuzzers.sh BUILD_DIR [JOBS [SECONDS [TARGET...]]]   (BUILD_DIR: a -DSLIMKV_FUZZ=ON build)
#   make test:     run_fuzzers.sh build/asan 2 20    (the brief run)
#   the long run:  run_fuzzers.sh build/asan 2 600   (issue 31: >= 10^6 executions per target)
# Each libFuzzer process uses one core, so JOBS = cores runs the targets side by side with the same
# executions per target as one after another, in 1/JOBS of the time.
set -uo pipefail
build_dir=$1 jobs=${2:-2} seconds=${3:-20}
shift $(($# < 3 ? $# : 3))
cd "$(dirname "$0")/.."
targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(ls fuzz/*_fuzz.cc 2>/dev/null | xargs -rn1 basename | sed 's/\.cc$//')
fi
((${#targets[@]})) || { echo "run_fuzzers: no fuzz targets"; exit 0; }
# A cmake build dir is brought up to date; a folder of prebuilt fuzz binaries is used as it is.
if [ -f "$build_dir/build.ninja" ]; then
  cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" || { echo "run_fuzzers: build failed"; exit 1; }
fi

run_one() {  # target: runs it, leaves its exit status in fuzz-work/<target>.rc
  local t=$1 work=$build_dir/fuzz-work/$1
  mkdir -p "$work"
  "$build_dir/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work" "fuzz/corpus/$t" >"$work.log" 2>&1
  echo $? >"$work.rc"
}
echo "run_fuzzers: ${#targets[@]} targets, ${seconds}s each, $jobs at a time"
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
  run_one "$t" &
done
wait

failed=0
report="| target | seconds | executions | exec/s | result |\n|---|---|---|---|---|\n"
for t in "${targets[@]}"; do
  log=$build_dir/fuzz-work/$t.log
  rc=$(cat "$build_dir/fuzz-work/$t.rc" 2>/dev/null || echo "?")
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  result=clean
  if [ "$rc" != 0 ]; then
    result="FAILED (exit $rc, see $log)"
    failed=1
    tail -n 40 "$log"
  fi
  report+="| $t | $seconds | ${runs:-?} | ${rate:-?} | $result |\n"
done
printf "%b" "$report"
((failed == 0)) && echo "run_fuzzers: all targets ran clean"
exit $failed
