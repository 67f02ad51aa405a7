#!/usr/bin/env python3
"""Which (layer, KV head)s should get more bits (hibits=B,hiheads=..., issue 28): each head's gain measured.

For a base spec, one `slimkv eval --tasks ppl` run measures on calibration text the base spec and, for every
(layer, KV head) in turn, the base spec with only that head at --bits bits; a head's gain is how much of the
base spec's KL divergence from dense (on the decode path) that one head's wider blocks remove. Prints the heads
by gain and the spec that widens the --heads best ones.

The calibration text must not be the text the result is then measured on: by default slimkv's own docs
(docs/*.md: technical English and code, none of it in the model's training or held-out text).

    python3 scripts/kv_head_bits.py --spec hack:bits=2,pi=128,klayout=channel,vlayout=token --bits 4 --heads 4
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slimkv", default="build/release/slimkv")
    ap.add_argument("--model", default="models/slimkv-llama-15m")
    ap.add_argument("--spec", required=True, help="the base KV spec (hack or quant)")
    ap.add_argument("--bits", type=int, default=4, help="the wider heads' bits (hibits)")
    ap.add_argument("--heads", type=int, default=2, help="how many heads the printed spec widens")
    ap.add_argument("--text", nargs="+", default=sorted(glob.glob("docs/*.md")), help="calibration text files")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the heads' measurements here")
    args = ap.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    layers, kv_heads = config["num_hidden_layers"], config.get("num_key_value_heads", config["num_attention_heads"])
    heads = [(layer, head) for layer in range(layers) for head in range(kv_heads)]
    widened = {f"{args.spec},hibits={args.bits},hiheads={layer}.{head}": (layer, head) for layer, head in heads}

    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "calibration.txt")
        with open(text, "w") as out:
            for path in args.text:
                with open(path) as f:
                    out.write(f.read() + "\n\n")
        command = [args.slimkv, "eval", "--model", args.model, "--tasks", "ppl", "--context", str(args.context),
                   "--samples", f"ppl={args.windows}", "--text", text, "--threads", str(args.threads), "--no-plots",
                   "--out", os.path.join(tmp, "eval"), "--kv", ",".join(["dense", args.spec, *widened])]
        print(" ".join(command[:-1]), "'" + command[-1] + "'", file=sys.stderr)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "eval", "results.json")) as f:
            results = json.load(f)

    kld = {row["spec"]: row["value"] for row in results["results"] if row["task"] == "ppl" and row["metric"] == "kld"}
    base = kld[args.spec]
    gains = sorted(((base - kld[spec], head) for spec, head in widened.items()), reverse=True)
    print(f"base {args.spec}: KL {base:.5f} on {args.windows} window(s) of {args.context} tokens of calibration text")
    print("layer.head  KL with that head at", args.bits, "bits   gain")
    for gain, (layer, head) in gains:
        print(f"{layer:5d}.{head:<4d}  {base - gain:.5f}{'':24s}{gain:+.5f} ({gain / base:.1%})")
    best = sorted(head for _, head in gains[:args.heads])
    print(f"{args.spec},hibits={args.bits},hiheads=" + "/".join(f"{layer}.{head}" for layer, head in best))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"spec": args.spec, "bits": args.bits, "context": args.context, "windows": args.windows,
                       "text": args.text, "base_kld": base,
                       "heads": [{"layer": layer, "head": head, "kld_gain": gain} for gain, (layer, head) in gains]},
                      f, indent=1)


if __name__ == "__main__":
    main()
