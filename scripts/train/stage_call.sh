#!/bin/bash
# Stage what GPU call N of the training run carries (run here, before each `run` call):
#
#   scripts/train/stage_call.sh CORPUS_DIR CARRY_DIR N
#
# CORPUS_DIR is build_corpus.py's output (<work>/corpus: train-NN.txt.xz and eval/); CARRY_DIR is a
# folder of the checkout that .git/info/exclude ignores and `run` names in `carry`. The folder is
# emptied first: a call carries one part (call 0 also the evaluation texts), so that the tracked
# tree plus the carried files stay under the 64 MiB a call may send.
set -euo pipefail
corpus=$1 carry=$2 n=$3
part=$(printf "%s/train-%02d.txt.xz" "$corpus" "$n")
[ -e "$part" ] || { echo "stage_call: no part $part" >&2; exit 1; }
rm -rf "$carry"
mkdir -p "$carry"
cp "$part" "$carry/"
if [ "$n" = 0 ]; then
  tar -C "$corpus/eval" -cJf "$carry/eval.tar.xz" .
fi
size=$(du -sb "$carry" | cut -f1)
echo "stage_call: $carry holds $(ls "$carry" | tr '\n' ' ')($((size / 1048576)) MiB)"
if [ "$size" -gt $((20 * 1048576)) ]; then
  echo "stage_call: over 20 MiB: with the ~42 MiB tracked tree the call would pass 64 MiB" >&2
  exit 1
fi
