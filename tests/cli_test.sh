#!/usr/bin/env bash
# The CLI as a user runs it: outputs of the happy paths, and one-line errors with a non-zero exit for
# bad input. Usage: cli_test.sh SLIMKV_BINARY SOURCE_DIR
set -u
slimkv=$1 src=$2
models=$src/tests/data/models
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0 passes=0

expect_ok() {  # name, command...
  local name=$1; shift
  if "$@" >"$work/out" 2>"$work/err"; then passes=$((passes + 1)); else
    echo "FAIL $name: exit $? — $(head -c 400 "$work/err")"; failures=$((failures + 1)); fi
}
expect_error() {  # name, text the error must contain, command...
  local name=$1 text=$2; shift 2
  if "$@" >"$work/out" 2>"$work/err"; then
    echo "FAIL $name: succeeded, expected an error containing '$text'"; failures=$((failures + 1))
  elif ! grep -qF -- "$text" "$work/err"; then
    echo "FAIL $name: error lacks '$text': $(head -c 400 "$work/err")"; failures=$((failures + 1))
  else passes=$((passes + 1)); fi
}

# logits: both modes write [n, vocab] float32 and agree with each other.
expect_ok logits-prefill "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens "1, 2 3,4" --out "$work/a.npy"
expect_ok logits-incremental "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens-file "$models/llama_gqa_bf16/golden_tokens.txt" --mode incremental --out "$work/b.npy"
size=$(stat -c %s "$work/a.npy" 2>/dev/null || echo 0)
[ "$size" -eq $((128 + 4 * 512 * 4)) ] && passes=$((passes + 1)) || { echo "FAIL logits size $size"; failures=$((failures + 1)); }

# tokenize needs only tokenizer.json.
expect_ok tokenize "$slimkv" tokenize --model "$src/tests/data/tokenizers/llama3_style" --text "Hello world"
grep -qE '^[0-9]+(,[0-9]+)+$' "$work/out" && passes=$((passes + 1)) || { echo "FAIL tokenize output: $(cat "$work/out")"; failures=$((failures + 1)); }
# ... or a GGUF file's metadata: the same vocabulary gives the same ids.
cp "$work/out" "$work/ids_json"
expect_ok tokenize-gguf "$slimkv" tokenize --model "$src/tests/data/gguf/vocab-llama3_style.gguf" --text "Hello world"
cmp -s "$work/out" "$work/ids_json" && passes=$((passes + 1)) || { echo "FAIL tokenize gguf: $(cat "$work/out") vs $(cat "$work/ids_json")"; failures=$((failures + 1)); }

# Bad input: one clear line naming the problem, non-zero exit.
expect_error bad-token '"x" (at byte 2) is not a token id' "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens "1,x,3" --out "$work/c.npy"
expect_error token-range "outside the vocabulary" "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens "1,99999" --out "$work/c.npy"
expect_error bad-kv "nosuch" "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens "1" --kv nosuch --out "$work/c.npy"
expect_error bad-mode "incremental" "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens "1" --mode sideways --out "$work/c.npy"
# SLIMKV_QUANT_DOT (docs/cli.md): f32 and the integer tiers decode a GGUF file's quantized weights alike (within
# the 8-bit rounding of the inputs); a bad value is reported, naming the expected ones, and ignored.
gguf_q8=$src/tests/data/gguf/llama_tiny-Q8_0.gguf
expect_ok quant-dot-f32 env SLIMKV_QUANT_DOT=f32 "$slimkv" logits --model "$gguf_q8" --tokens "1,2,3" --mode incremental --out "$work/f32.npy"
expect_ok quant-dot-bad env SLIMKV_QUANT_DOT=int4 "$slimkv" logits --model "$gguf_q8" --tokens "1,2,3" --mode incremental --out "$work/int.npy"
grep -qF "SLIMKV_QUANT_DOT=int4: expected f32, scalar, avx2, avx-vnni or avx512-vnni; ignored" "$work/err" &&
  passes=$((passes + 1)) || { echo "FAIL quant-dot-bad message: $(head -c 400 "$work/err")"; failures=$((failures + 1)); }
expect_error no-model "missing_dir" "$slimkv" logits --model "$work/missing_dir" --tokens "1" --out "$work/c.npy"
expect_error no-tokenizer "tokenizer.json" "$slimkv" generate --model "$models/qwen2_bias_tied" --prompt "hi"
expect_error empty-prompt "empty" "$slimkv" generate --model "$models/qwen2_bias_tied" --prompt ""
expect_error unknown-option "--frobnicate" "$slimkv" generate --model "$models/qwen2_bias_tied" --frobnicate
expect_error no-subcommand "subcommand" "$slimkv"
# --device cuda where no GPU is usable (CI) is a clear error; on a GPU machine tests/cuda run it.
if ! nvidia-smi >/dev/null 2>&1; then
  expect_error no-gpu "CUDA" "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens "1" --device cuda --out "$work/c.npy"
fi
# --device cuda:N: the form is checked as the line is parsed, by every command that takes it (a bad one
# names the expected forms); whether GPU N exists, before the model loads (tests/cuda/device_choice_test.cc).
for device in cpu cuda cuda:0 cuda:1 cuda:12; do
  expect_ok "device-form-$device" "$slimkv" --dry-parse generate --model "$models/llama_gqa_bf16" --prompt hi --device "$device"
done
for device in cuda:x cuda:-1 cuda: cpu:1 cuda:1x " cuda" CUDA; do
  expect_error "device-form-'$device'" "device '$device' is not known: expected cpu, cuda, or cuda:N" \
    "$slimkv" --dry-parse generate --model "$models/llama_gqa_bf16" --prompt hi --device "$device"
done
expect_error device-form-eval "device 'cuda:x' is not known" "$slimkv" --dry-parse eval --model "$src/models/slimkv-llama-15m" --kv dense \
  --tasks ppl --device cuda:x --out "$work/e"
expect_error device-form-serve "device 'gpu:1' is not known" "$slimkv" --dry-parse serve --model "$src/models/slimkv-llama-15m" --device gpu:1
if ! nvidia-smi >/dev/null 2>&1; then
  # A build with the CUDA backend (its plugin beside slimkv) finds no GPU; one without says so.
  if [ -e "$(dirname "$slimkv")/libslimkv_cuda.so" ]; then why="this process sees no GPU"; else why="this build has no CUDA backend"; fi
  expect_error no-gpu-index "device 'cuda:1': $why" \
    "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens "1" --device cuda:1 --out "$work/c.npy"
fi
# ZACK: the calibration a spec names must exist and be this model's.
bundled=$src/models/slimkv-llama-15m
expect_error zack-no-calibration "zack.safetensors" "$slimkv" logits --model "$models/qwen2_bias_tied" --tokens "1" --kv zack:r=0.05 --out "$work/c.npy"
expect_error zack-foreign-calibration "another model" "$slimkv" logits --model "$models/llama_gqa_bf16" --tokens "1" --kv "zack:r=0.05,calib=$bundled/zack.safetensors" --out "$work/c.npy"
expect_error calibrate-no-text "missing.txt" "$slimkv" calibrate --model "$bundled" --text "$work/missing.txt" --out "$work/z.safetensors"
expect_error calibrate-short-text "fewer than --tokens" "$slimkv" calibrate --model "$bundled" --text "$bundled/passkey_prompt.txt" --tokens 100000 --out "$work/z.safetensors"
mkdir -p "$work/weird" && cp "$models/qwen2_bias_tied/"* "$work/weird/" &&
  sed -i 's/Qwen2ForCausalLM/GPTNeoXForCausalLM/' "$work/weird/config.json"
expect_error unknown-architecture "GPTNeoXForCausalLM" "$slimkv" logits --model "$work/weird" --tokens "1" --out "$work/c.npy"
mkdir -p "$work/truncated" && cp "$models/mistral_f16/"* "$work/truncated/" &&
  truncate -s 5000 "$work/truncated/model.safetensors"
expect_error truncated-weights "model.safetensors" "$slimkv" logits --model "$work/truncated" --tokens "1" --out "$work/c.npy"

# Paths of the wrong kind are named for what they are, by every command that reads a file (never read as
# empty text, never a hang on a FIFO: `timeout` turns a hang into a failure).
mkdir -p "$work/a_dir"; mkfifo "$work/a_fifo"; echo "1,2" >"$work/secret.txt"; chmod 000 "$work/secret.txt"
bad_path_cases() {  # kind, path, what the error must say
  local kind=$1 path=$2 text=$3 m=$models/llama_gqa_bf16
  expect_error "generate-prompt-file-$kind" "$text" timeout 20 "$slimkv" generate --model "$m" --prompt-file "$path" --max-tokens 1
  expect_error "logits-tokens-file-$kind" "$text" timeout 20 "$slimkv" logits --model "$m" --tokens-file "$path" --out "$work/x.npy"
  expect_error "tokenize-file-$kind" "$text" timeout 20 "$slimkv" tokenize --model "$m" --file "$path"
  expect_error "calibrate-text-$kind" "$text" timeout 20 "$slimkv" calibrate --model "$m" --text "$path" --out "$work/calib_$kind"
}
bad_path_cases directory "$work/a_dir" "a_dir: is a directory, expected a file"
bad_path_cases fifo "$work/a_fifo" "a_fifo: is a FIFO (named pipe), expected a regular file"
bad_path_cases missing "$work/nothing_here" "nothing_here: does not exist"
bad_path_cases device /dev/null "/dev/null: is a device, expected a regular file"
if [ "$(id -u)" -eq 0 ]; then
  echo "cli: skipping the unreadable-file cases: running as root, which reads a chmod 000 file"
else
  bad_path_cases unreadable "$work/secret.txt" "secret.txt: not readable"
fi
# The model folder's files: each replaced by a directory.
for name in config.json generation_config.json model.safetensors.index.json model-00003-of-00012.safetensors; do
  rm -rf "$work/m_$name"; cp -r "$models/llama_gqa_bf16" "$work/m_$name"
  rm -f "$work/m_$name/$name"; mkdir "$work/m_$name/$name"
  expect_error "model-dir-$name-is-directory" "$name: is a directory, expected a file" \
    timeout 20 "$slimkv" logits --model "$work/m_$name" --tokens "1" --out "$work/x.npy"
done

# Broken weights are refused at load, naming the tensor: a copy of a small model with one NaN (and one
# -Inf) planted in a tensor's raw bits (F16 here; the BF16/F32 bit patterns are covered by finite_test).
plant() {  # model dir, tensor name, element index or "all", struct format of one element, value
  /usr/bin/python3 - "$@" <<'PY'
import json, os, struct, sys
model, name, index, fmt = sys.argv[1:5]
path = model + "/model.safetensors"
if not os.path.exists(path):  # sharded: the index names the tensor's file
    path = model + "/" + json.load(open(model + "/model.safetensors.index.json"))["weight_map"][name]
value = float(sys.argv[5]) if fmt.endswith("f") else int(sys.argv[5], 16)
size = struct.calcsize(fmt)
with open(path, "r+b") as f:
    header_len = struct.unpack("<Q", f.read(8))[0]
    begin, end = json.loads(f.read(header_len))[name]["data_offsets"]
    first, count = (0, (end - begin) // size) if index == "all" else (int(index), 1)
    f.seek(8 + header_len + begin + size * first)
    f.write(struct.pack(fmt, value) * count)
PY
}
for case in "nan 7e00 NaN" "neginf fc00 -Inf"; do
  set -- $case
  rm -rf "$work/broken_$1"; cp -r "$models/mistral_f16" "$work/broken_$1"
  plant "$work/broken_$1" model.layers.1.mlp.up_proj.weight 37 "<H" "$2"
  expect_error "weights-$1" "tensor 'model.layers.1.mlp.up_proj.weight' (F16) holds $3 at element 37 (row 0, column 37)" \
    "$slimkv" logits --model "$work/broken_$1" --tokens "1,2" --out "$work/x.npy"
  expect_error "weights-$1-generate" "model.layers.1.mlp.up_proj.weight" \
    "$slimkv" generate --model "$work/broken_$1" --prompt "hi" --max-tokens 2
done
# Finite weights whose forward pass overflows: every weight passes the load check, but a final norm of
# BF16's largest value (0x7f7f, 3.39e38) makes the normalised hidden state, and so the logits, infinite
# or NaN. The step is refused naming sequence, position and token, never sampled into text with exit 0.
rm -rf "$work/overflow"; cp -r "$src/models/slimkv-llama-15m" "$work/overflow"
plant "$work/overflow" model.norm.weight all "<H" 7f7f
expect_error logits-overflow "position 0: logit of token" \
  "$slimkv" logits --model "$work/overflow" --tokens "1,2" --out "$work/x.npy"
expect_error logits-overflow-generate "(non-finite: broken weights or an overflow in the forward pass)" \
  "$slimkv" generate --model "$work/overflow" --prompt "hi" --max-tokens 2

# Messages: untrusted bytes escaped and cut, JSON errors with line and column, unknown commands named,
# outputs checked before the work, control characters in a spec refused, zack's r and rate agree.
bundled=$src/models/slimkv-llama-15m
expect_error unknown-command 'unknown command "frobnicate" (commands: calibrate, generate, logits, tokenize, eval' "$slimkv" frobnicate
expect_error unknown-option "--bogus" "$slimkv" logits --model "$bundled" --tokens 1 --bogus 3 --out "$work/x.npy"
expect_error tokens-binary-junk '--tokens: "\x01\xFF" (at byte 4) is not a token id' "$slimkv" logits --model "$bundled" --tokens $'1,2,\x01\xff' --out "$work/x.npy"
head -c 3000 /dev/zero | tr '\0' 'x' >"$work/long_token.txt"
expect_error tokens-long-piece-cut '(2936 more bytes)' "$slimkv" logits --model "$bundled" --tokens-file "$work/long_token.txt" --out "$work/x.npy"
expect_error tokens-overflow '"99999999999" (at byte 0) is not a token id' "$slimkv" logits --model "$bundled" --tokens 99999999999 --out "$work/x.npy"
expect_error logits-out-directory "--out: $work: is a directory, expected a file name to write" "$slimkv" logits --model "$bundled" --tokens 1 --out "$work"
expect_error calibrate-out-missing-folder "--out: $work/no/x.safetensors: cannot be written: its folder $work/no does not exist" \
  "$slimkv" calibrate --model "$bundled" --text "$bundled/heldout.txt" --out "$work/no/x.safetensors"
echo x >"$work/plain_file"
expect_error eval-out-under-file "--out: $work/plain_file/out: cannot be an output directory: $work/plain_file (part of the path) is not a directory" \
  "$slimkv" eval --model "$bundled" --tasks ppl --out "$work/plain_file/out"
expect_error spec-control-character 'KV spec "dense\x07": control character "\x07" at byte 5' "$slimkv" generate --model "$bundled" --prompt hi --max-tokens 1 --kv $'dense\x07'
expect_error spec-zack-r-1 "zack option r=1 is invalid: expected a number in [0, 0.999]" "$slimkv" generate --model "$bundled" --prompt hi --max-tokens 1 --kv zack:r=1
expect_error spec-zack-rate-1 "zack option rate=1 is invalid: expected a number in [0, 0.999]" "$slimkv" generate --model "$bundled" --prompt hi --max-tokens 1 --kv zack:rate=1
for name in config.json generation_config.json tokenizer.json tokenizer_config.json model.safetensors.index.json; do
  rm -rf "$work/json_$name"; cp -r "$bundled" "$work/json_$name"
  printf '{\n  "a": 1,\n  \x01\n}\n' >"$work/json_$name/$name"
  expect_error "json-syntax-$name" "$name:3:3: not valid JSON" "$slimkv" generate --model "$work/json_$name" --prompt hi --max-tokens 1
done

echo "cli: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
