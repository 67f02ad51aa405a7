#!/usr/bin/env bash
# slimkv eval as a user runs it on the bundled model: results.json valid against
# docs/eval_results.schema.json (checked by python3-jsonschema), results.md and the plots written, and
# every bad spec, task or setting refused before any work, naming the bad part.
# Usage: eval_cli_test.sh SLIMKV_BINARY SOURCE_DIR
set -u
slimkv=$1 src=$2
model=$src/models/slimkv-llama-15m
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0 passes=0
check() {  # name, condition...
  local name=$1; shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL $name"; failures=$((failures + 1)); fi
}
expect_error() {  # name, text the error must contain, args...
  local name=$1 text=$2; shift 2
  if "$slimkv" eval --model "$model" --out "$work/bad" "$@" >"$work/out" 2>"$work/err"; then
    echo "FAIL $name: succeeded"; failures=$((failures + 1))
  elif ! grep -qF -- "$text" "$work/err" || [ -e "$work/bad" ] || grep -q "^eval: " "$work/err"; then
    echo "FAIL $name: expected '$text' before any work: $(head -c 300 "$work/err")"; failures=$((failures + 1))
  else passes=$((passes + 1)); fi
}

plots=--no-plots
command -v gnuplot >/dev/null && plots=
"$slimkv" eval --model "$model" --kv "hack:bits=4,dense:dtype=f16" --tasks memory,fidelity,speed --context 160 \
  --samples 2,speed=1 $plots --out "$work/run" 2>"$work/log"
check eval-exit test $? -eq 0
check schema /usr/bin/python3 -c "
import json, jsonschema, sys
schema = json.load(open('$src/docs/eval_results.schema.json'))
results = json.load(open('$work/run/results.json'))
jsonschema.validate(results, schema)
assert results['specs'] == ['dense', 'hack:bits=4', 'dense:dtype=f16'], results['specs']
assert results['settings']['samples'] == {'memory': 2, 'fidelity': 2, 'speed': 1}, results['settings']
fidelity = [r['value'] for r in results['results'] if r['task'] == 'fidelity' and r['spec'] == 'dense']
assert fidelity and all(v == 0 for v in fidelity), fidelity
"
check markdown grep -q '^| `hack:bits=4` |' "$work/run/results.md"
if [ -z "$plots" ]; then check plots test -s "$work/run/fidelity.png"; fi

expect_error bad-task "unknown task 'nosuch'" --kv dense --tasks ppl,nosuch
expect_error bad-spec "nosuch" --kv dense,nosuch:bits=2 --tasks ppl
expect_error bad-option "bits" --kv "hack:bits=3" --tasks ppl
expect_error twice "given twice" --kv dense --tasks ppl,ppl
expect_error samples-task "not among --tasks" --kv dense --tasks ppl --samples passkey=2
expect_error samples-value "is not N or task=N" --kv dense --tasks ppl --samples ppl=many
expect_error long-context "outside the model's context" --kv dense --tasks ppl --context 100000
expect_error short-context "too short" --kv dense --tasks passkey --context 40
expect_error missing-text "nope.txt" --kv dense --tasks ppl --text "$work/nope.txt"
expect_error gpu-memory "runs on --device cpu only" --kv dense --tasks ppl,memory --device cuda

echo "eval_cli_test: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
