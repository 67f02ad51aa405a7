#!/usr/bin/env bash
# Runs fuzz targets from their seed corpora (fuzz/corpus/<name>/, plus fuzz/corpus-packed/<name>.tar.xz where
# a long run's grown inputs are kept compressed; new inputs kept in BUILD_DIR/fuzz-work/<name>/), JOBS targets at a time, each for SECONDS, then prints a table of
# executions per target. Any crash, leak, timeout or sanitizer report fails the run; its log and
# reproducer are left in BUILD_DIR/fuzz-work/.
# Usage: run_fuzzers.sh BUILD_DIR [JOBS [SECONDS [TARGET[:WORKERS]...]]]
#   BUILD_DIR: a -DSLIMKV_FUZZ=ON build, or a folder of prebuilt fuzz binaries
#   make test:     run_fuzzers.sh build/sanitize 2 10    (the brief run)
#   the long run:  run_fuzzers.sh build/sanitize 2 600   (issue 31: >= 10^6 executions per target)
#   many cores:    run_fuzzers.sh DIR 8 240 chat_template_fuzz:4 tokenizer_json_fuzz:4 ...
# Each libFuzzer process uses one core, so JOBS = cores runs the targets side by side with the same
# executions per target as one after another, in 1/JOBS of the time. TARGET:WORKERS runs that target
# as WORKERS processes (libFuzzer's -fork=WORKERS: one corpus, the executions of all counted; it takes
# WORKERS cores, so JOBS counts targets, not cores).
set -uo pipefail
build_dir=$1 jobs=${2:-2} seconds=${3:-20}
shift $(($# < 3 ? $# : 3))
cd "$(dirname "$0")/.."
targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(ls fuzz/*_fuzz.cc 2>/dev/null | xargs -rn1 basename | sed 's/\.cc$//')
fi
((${#targets[@]})) || { echo "run_fuzzers: no fuzz targets"; exit 0; }

run_one() {  # target workers: runs it, leaves its exit status in fuzz-work/<target>.rc
  local t=$1 workers=$2 work=$build_dir/fuzz-work/$1 fork=() corpora=("fuzz/corpus/$1")
  ((workers > 1)) && fork=(-fork="$workers")
  mkdir -p "$work"
  # Thousands of small grown inputs are kept as one archive (they compress ~30x, and the tree travels to the
  # GPU host under a size limit); unpacked beside the build once.
  if [ -f "fuzz/corpus-packed/$t.tar.xz" ]; then
    local packed=$build_dir/fuzz-packed
    [ -d "$packed/$t" ] || { mkdir -p "$packed" && tar -xJf "fuzz/corpus-packed/$t.tar.xz" -C "$packed"; }
    corpora+=("$packed/$t")
  fi
  "$build_dir/$t" "${fork[@]}" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work" "${corpora[@]}" >"$work.log" 2>&1
  echo $? >"$work.rc"
}
declare -A workers_of
for i in "${!targets[@]}"; do
  spec=${targets[$i]} workers=1
  [[ $spec == *:* ]] && workers=${spec##*:}
  [[ $workers =~ ^[1-9][0-9]*$ ]] || { echo "run_fuzzers: '$spec': workers must be a positive count"; exit 2; }
  targets[$i]=${spec%%:*}
  workers_of[${targets[$i]}]=$workers
done
# A cmake build dir is brought up to date; a folder of prebuilt fuzz binaries is used as it is.
if [ -f "$build_dir/build.ninja" ]; then
  cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" || { echo "run_fuzzers: build failed"; exit 1; }
fi
echo "run_fuzzers: ${#targets[@]} targets, ${seconds}s each, $jobs at a time"
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
  run_one "$t" "${workers_of[$t]}" &
done
wait

failed=0
report="| target | workers | seconds | executions | exec/s | result |\n|---|---|---|---|---|---|\n"
for t in "${targets[@]}"; do
  log=$build_dir/fuzz-work/$t.log
  rc=$(cat "$build_dir/fuzz-work/$t.rc" 2>/dev/null || echo "?")
  if ((${workers_of[$t]} > 1)); then
    # -fork: the parent's status lines "#RUNS: cov: ... time: Ns" count the executions of every finished
    # job, and the seconds since it started (the last job may run past SECONDS).
    last=$(grep -E '^#[0-9]+: cov' "$log" | tail -1)
    runs=$(grep -oE '^#[0-9]+' <<<"$last" | tr -d '#')
    took=$(grep -oE 'time: [0-9]+s' <<<"$last" | grep -oE '[0-9]+')
    rate=$([ -n "$runs" ] && ((took > 0)) && echo $((runs / took)))
  else
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  fi
  result=clean
  if [ "$rc" != 0 ]; then
    result="FAILED (exit $rc, see $log)"
    failed=1
    tail -n 40 "$log"
  fi
  report+="| $t | ${workers_of[$t]} | $seconds | ${runs:-?} | ${rate:-?} | $result |\n"
done
printf "%b" "$report"
((failed == 0)) && echo "run_fuzzers: all targets ran clean"
exit $failed
