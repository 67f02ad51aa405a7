#!/bin/bash
# Stage what GPU call N of the training run carries (run here, before each `run` call):
#
#   scripts/train/stage_call.sh CORPUS_DIR CARRY_DIR N
#
# CORPUS_DIR is build_corpus.py's output (<work>/corpus: train-NN.txt.xz and eval/); CARRY_DIR is a
# folder of the checkout that .git/info/exclude ignores and `run` names in `carry`. The folder is
# emptied first: a call carries one part (call 0 also the evaluation texts), so that the tree
# plus the carried files stay under the 64 MiB a call may send. Run it from the repository root.
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
# What a call sends: the files git does not ignore (tracked or not) and the carried folder.
size=$(du -sb "$carry" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb | tail -1 | cut -f1)
echo "stage_call: $carry holds $(ls "$carry" | tr '\n' ' ')($((size / 1048576)) MiB;" \
     "with the tree $(((size + tree) / 1048576)) MiB of the 64 a call sends)"
if [ $((size + tree)) -gt $((63 * 1048576)) ]; then
  echo "stage_call: over 63 MiB with the tree: the call would pass (or nearly) 64 MiB" >&2
  exit 1
fi
