#!/bin/bash
# Stage what one GPU call of the training run carries (run here, before the `run` call):
#
#   scripts/train/stage_call.sh CORPUS_DIR CARRY_DIR N [N...]
#
# CORPUS_DIR is build_corpus.py's output (<work>/corpus: train-NN.txt.xz and eval/); CARRY_DIR is a
# folder of the checkout that .git/info/exclude ignores and `run` names in `carry`. The folder is
# emptied first, then gets parts N... (and, with part 0, the evaluation texts). The tree plus the
# carried files must stay under what a call may send (scripts/train/README.md "Order of calls": with
# the bundled weights left out of the tree, three parts a call). Run it from the repository root.
set -euo pipefail
corpus=$1 carry=$2
shift 2
rm -rf "$carry"
mkdir -p "$carry"
for n in "$@"; do
  part=$(printf "%s/train-%02d.txt.xz" "$corpus" "$n")
  [ -e "$part" ] || { echo "stage_call: no part $part" >&2; exit 1; }
  cp "$part" "$carry/"
  if [ "$n" = 0 ]; then
    tar -C "$corpus/eval" -cJf "$carry/eval.tar.xz" .
  fi
done
# What a call sends: the files git does not ignore (tracked or not) and the carried folder.
size=$(du -sb "$carry" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb | tail -1 | cut -f1)
# A call of 59.3 MB (tree + carried) was sent, one of 59.8 MB refused (2026-11-28): keep under 59 MB.
echo "stage_call: $carry holds $(ls "$carry" | tr '\n' ' ')($((size / 1000000)) MB;" \
     "with the tree $(((size + tree) / 1000000)) MB of the ~59 a call may send)"
if [ $((size + tree)) -gt 59000000 ]; then
  echo "stage_call: over 59 MB with the tree: the call would be refused" >&2
  exit 1
fi
