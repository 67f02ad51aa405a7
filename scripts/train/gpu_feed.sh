#!/bin/bash
# One GPU call of the model's training run: appends the parts this call carried to the machine's
# persistent folder, starts (or resumes) train.py in the background the first time, and reports.
# The machine keeps /root/model2 while it is held (a call at least every ~30 s keeps it), so the
# corpus arrives over several calls while the model already trains (scripts/train/README.md).
#
#   scripts/train/gpu_feed.sh CARRY_DIR [train.py arguments...]   append parts, start if needed
#   scripts/train/gpu_feed.sh --wait SECONDS                      wait for the end (or SECONDS)
#
# CARRY_DIR holds this call's train-NN.txt.xz parts and, on the first call, eval.tar.xz (the
# evaluation texts). Whatever is under $OUT comes back: the logs, and at the end the model.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${MODEL2_STATE:-/root/model2}
OUT=${OUT:-/tmp/out}
mkdir -p "$STATE/parts" "$STATE/eval" "$OUT"

running() { [ -e "$STATE/trainer.pid" ] && kill -0 "$(cat "$STATE/trainer.pid")" 2>/dev/null; }

report() {
  echo "== $(date +%T) parts: $(ls "$STATE/parts" | tr '\n' ' ')"
  echo "== shards: $(ls "$STATE/shards" 2>/dev/null | grep -c '\.npy$' || true); running: $(running && echo yes || echo no); exit: $(cat "$STATE/exit" 2>/dev/null || echo -)"
  tail -n 25 "$STATE/train.log" 2>/dev/null || true
  cp "$STATE/train.log" "$OUT/" 2>/dev/null || true
  cp "$STATE/train_log.csv" "$OUT/" 2>/dev/null || true
}

if [ "${1:-}" = "--wait" ]; then
  deadline=$(( $(date +%s) + ${2:-500} ))
  while running && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  report
  model="$STATE/model"
  if [ "$(cat "$STATE/exit" 2>/dev/null)" = 0 ] && [ -e "$model/eval.json" ]; then
    # at most 8 files of 16 MiB come back: the weight shards alone, the rest in one tarball
    cp "$model"/model-*.safetensors "$OUT/"
    tar -C "$model" -czf "$OUT/model-files.tar.gz" --exclude='model-*.safetensors' .
    ls -la "$OUT"
  fi
  exit 0
fi

carry=$1
shift
# Parts are copied under a temporary name and renamed: the trainer never sees half a part.
for f in "$carry"/train-*.txt.xz; do
  [ -e "$f" ] || continue
  xz -t "$f" || { echo "gpu_feed: $f is corrupt (xz -t failed)" >&2; exit 1; }
  cp "$f" "$STATE/parts/.incoming"
  mv "$STATE/parts/.incoming" "$STATE/parts/$(basename "$f")"
done
if [ -e "$carry/eval.tar.xz" ]; then
  tar -xJf "$carry/eval.tar.xz" -C "$STATE/eval"
fi

# Start the trainer unless it runs or has finished; after a crash, resume from the checkpoint.
if ! running && [ "$(cat "$STATE/exit" 2>/dev/null)" != 0 ]; then
  rm -f "$STATE/exit"
  resume=""
  [ -e "$STATE/ckpt.pt" ] && resume="--resume"
  # setsid: the trainer outlives this call (processes a call leaves are killed otherwise)
  PYTHONUNBUFFERED=1 setsid bash -c 'python3 "$0"/train.py --data-dir "$1" "${@:2}"; echo $? > "$1/exit"' \
    "$HERE" "$STATE" $resume "$@" >> "$STATE/train.log" 2>&1 < /dev/null &
  echo $! > "$STATE/trainer.pid"
  echo "gpu_feed: trainer started ($resume)"
  sleep 20  # let it report its start
fi
report
