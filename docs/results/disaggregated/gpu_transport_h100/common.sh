# What the device calls share: unpacking, the device's name, and the runs they make.
(cd "$w" && tar -xJf gpurun.tar.xz)
export LD_LIBRARY_PATH=$w/lib:${LD_LIBRARY_PATH:-} XDG_CACHE_HOME=/tmp/xdg PYTHONUNBUFFERED=1
mkdir -p /work/wt && ln -sfn "$root" /work/wt/gpu-transport  # the test binary's SLIMKV_SOURCE_DIR
{ nvidia-smi -L; date -u; cat "$w/commit.txt"; } | tee -a "$OUT/device.txt"
M=/tmp/llama3-8b-random
# The 8B model's servers: three at once on one GPU (both, prefill, decode), 16 GB of weights each.
BIG="--kv-cache-bytes 4000000000 --max-model-len 8192 --max-num-seqs 4"
start_model_generation() {  # in its own session: it outlives the call while the machine stays warm
  [ -f /tmp/model_gen.log ] && return 0
  setsid bash -c "python3 scripts/make_random_model.py --shape llama3-8b --out $M > /tmp/model_gen.log 2>&1; echo done >> /tmp/model_gen.log" &
}
wait_for_model() {  # wait_for_model TIMEOUT
  local t0=$(date +%s)
  while ! grep -q done /tmp/model_gen.log 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt $1 ]; do sleep 2; done
  echo "model: $(tail -2 /tmp/model_gen.log | tr '\n' ' ') (waited $(( $(date +%s) - t0 )) s)" | tee -a "$OUT/device.txt"
}
disagg() {  # disagg FILE TIMEOUT SERVE_ARGS...: tests/serve/disaggregated_test.py on the GPU
  local file=$1 limit=$2; shift 2
  echo "== disaggregated_test --device cuda $*" | tee -a "$OUT/$file"
  timeout "$limit" python3 "$w/scripts/disaggregated_test.py" "$w/bin/slimkv" "$root" --device cuda "$@" >> "$OUT/$file" 2>&1
  echo "rc=$?" | tee -a "$OUT/$file"; tail -4 "$OUT/$file"
}
bench() {  # bench FILE TIMEOUT ARGS...: the transport benchmark, Llama-3-8B KV shape
  local file=$1 limit=$2; shift 2
  timeout "$limit" "$w/bin/bench_kv_transport_cuda" --shape llama3-8b --transports cuda_ipc,tcp,tcp@100,tcp@10 "$@" 2>&1 \
    | tee "$OUT/$file"
}
