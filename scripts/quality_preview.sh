#!/usr/bin/env bash
# A quick look at what KV specs cost in quality on the bundled model: perplexity, KL divergence from
# dense and top-1 agreement over one window of held-out text, scored on the decode path. A preview
# until `slimkv eval` (issue 5) exists. Needs /usr/bin/python3 with numpy (Debian: python3-numpy).
# Usage: scripts/quality_preview.sh [TOKENS] SPEC...   (the first spec is the reference, e.g. dense)
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:-2048}; shift
model=models/slimkv-llama-15m
bin=build/release/slimkv
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c $((tokens * 6)) $model/heldout.txt > "$work/text.txt"
$bin tokenize --model $model --file "$work/text.txt" | tr ',' '\n' | head -n "$tokens" | paste -sd, > "$work/ids.txt"
args=()
for spec in "$@"; do
  out="$work/$(echo "$spec" | tr ':,=' '___').npy"
  $bin logits --model $model --tokens-file "$work/ids.txt" --mode incremental --kv "$spec" --out "$out"
  args+=("$spec" "$out")
done
/usr/bin/python3 - "$work/ids.txt" "${args[@]}" <<'PY'
import sys
import numpy as np
ids = [int(x) for x in open(sys.argv[1]).read().split(",")]
reference = None
for spec, path in zip(sys.argv[2::2], sys.argv[3::2]):
    logits = np.load(path).astype(np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    nll = -logp[np.arange(len(ids) - 1), ids[1:]]
    if reference is None:
        reference = logp
    kld = (np.exp(reference) * (reference - logp)).sum(1).mean()
    top1 = (reference.argmax(1) == logp.argmax(1)).mean()
    print(f"{spec:45s} ppl {np.exp(nll.mean()):8.3f}  kld {kld:.4f}  top1 {top1:.3f}")
PY
