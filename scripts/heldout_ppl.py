#!/usr/bin/env python3
"""slimkv's perplexity on a held-out text with the model card's protocol, for comparison with the
transformers figure there: encode the text as one string without special tokens, cut the ids into
consecutive chunks of L-1 tokens (remainder dropped), prepend BOS to each, exp(mean NLL over all chunk
tokens). Runs `slimkv logits --mode prefill` per window. (A stand-in until `slimkv eval`, issue 5.)

    /usr/bin/python3 scripts/heldout_ppl.py --model models/slimkv-llama-15m --context 1024 [--kv dense]
Needs numpy (Debian: python3-numpy).
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", help="default: MODEL/heldout.txt")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--kv", default="dense")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slimkv", default="build/release/slimkv")
    parser.add_argument("--max-windows", type=int, default=0, help="0: all")
    parser.add_argument("--record", metavar="REFERENCE_JSON",
                        help="also write the result beside the plain reference's (scripts/train/reference_cpu.py) "
                             "of the same context and windows, as its slimkv_ppl (the model card reads it)")
    args = parser.parse_args()
    text = args.text or os.path.join(args.model, "heldout.txt")
    bos = json.load(open(os.path.join(args.model, "config.json")))["bos_token_id"]
    ids_text = subprocess.run([args.slimkv, "tokenize", "--model", args.model, "--file", text, "--no-special-tokens"],
                              check=True, capture_output=True, text=True).stdout
    ids = [int(x) for x in ids_text.strip().split(",")]
    chunk = args.context - 1
    windows = len(ids) // chunk
    if args.max_windows:
        windows = min(windows, args.max_windows)
    # A reference to record beside is checked before the windows run (minutes at long contexts).
    reference = load_reference(args.record, args.context, windows) if args.record else None
    total_nll, count = 0.0, 0
    with tempfile.TemporaryDirectory() as work:
        for w in range(windows):
            window = [bos] + ids[w * chunk:(w + 1) * chunk]
            with open(os.path.join(work, "ids.txt"), "w") as f:
                f.write(",".join(map(str, window)))
            out = os.path.join(work, "logits.npy")
            subprocess.run([args.slimkv, "logits", "--model", args.model, "--tokens-file", os.path.join(work, "ids.txt"),
                            "--out", out, "--kv", args.kv, "--threads", str(args.threads)], check=True)
            logits = np.load(out).astype(np.float64)[:-1]
            logp = logits - logits.max(1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(1, keepdims=True))
            total_nll -= logp[np.arange(chunk), window[1:]].sum()
            count += chunk
    ppl = float(np.exp(total_nll / count))
    print(json.dumps({"model": args.model, "kv": args.kv, "context": args.context, "windows": windows,
                      "tokens": count, "ppl": ppl}))
    if reference is not None:
        entry = reference["ppl_%d" % args.context]
        entry["slimkv_ppl"], entry["slimkv_kv"] = ppl, args.kv
        with open(args.record, "w") as f:
            json.dump(reference, f, indent=1)
            f.write("\n")


def load_reference(path, context, windows):
    """The reference JSON at `path` (scripts/train/reference_cpu.py --record), refused unless its
    ppl_CONTEXT entry is over the same `windows`: perplexities over other windows are not comparable."""
    try:
        with open(path) as f:
            reference = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit("heldout_ppl: --record %s: cannot read it as JSON: %s" % (path, e))
    key = "ppl_%d" % context
    entry = reference.get(key) if isinstance(reference, dict) else None
    if not isinstance(entry, dict):
        raise SystemExit("heldout_ppl: --record %s has no \"%s\" entry (a reference perplexity at context %d; "
                         "scripts/train/reference_cpu.py ppl --context %d --record writes one)" % (path, key, context, context))
    if entry.get("windows") != windows:
        raise SystemExit("heldout_ppl: --record %s: \"%s\" is over %s windows, this run over %d (--max-windows sets "
                         "it): only perplexities over the same windows compare" % (path, key, entry.get("windows"), windows))
    return reference


if __name__ == "__main__":
    main()
