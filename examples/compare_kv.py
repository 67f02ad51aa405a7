#!/usr/bin/env python3
"""Compares KV specs on the bundled model with the slimkv Python module (docs/python.md): the attention
error each spec's KV encoding causes per layer (eval's fidelity task), pass-key retrieval accuracy (eval's
passkey task) and the bytes each spec's sealed KV takes per token, plotted into one PNG.

    PYTHONPATH=build/release/python python3 examples/compare_kv.py [--out compare_kv.png] [--context 512]
(about a minute of CPU time with the defaults; docs/python.md shows its output).
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt

import slimkv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = ["dense", "hack:bits=2", "pq:topk=0.1"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "slimkv-llama-15m"))
    parser.add_argument("--context", type=int, default=512, help="tokens of the longest prompt")
    parser.add_argument("--samples", type=int, default=1, help="pass-key prompts per (placement, length, depth) cell")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", default="compare_kv.png")
    args = parser.parse_args()

    # One run of both tasks for every spec: the long table, one row per (spec, task, metric, grid key).
    rows = slimkv.evaluate(args.model, SPECS, ["fidelity", "passkey"], context=args.context,
                           samples={"passkey": args.samples}, threads=args.threads, dataframe=False)
    # Sealed KV bytes per token: a session per spec, the held-out text prefilled, its KV asked.
    bytes_per_token = {}
    with open(os.path.join(args.model, "heldout.txt")) as text:
        heldout = text.read()
    for spec in SPECS:
        engine = slimkv.Engine(args.model, kv=spec, threads=args.threads)
        session = engine.session()
        session.prefill(engine.tokenizer.encode(heldout)[:args.context])
        bytes_per_token[spec] = session.kv.memory()["sealed_bytes_per_token"]

    figure, (error_axes, accuracy_axes, bytes_axes) = plt.subplots(1, 3, figsize=(15, 4.2))
    for spec in SPECS:
        per_layer = sorted((row["layer"], row["value"]) for row in rows
                           if row["spec"] == spec and row["task"] == "fidelity" and row["metric"] == "rel_l2"
                           and row["layer"] is not None)
        error_axes.plot([layer for layer, _ in per_layer], [value for _, value in per_layer], marker="o", label=spec)
    error_axes.set(title="attention-output error per layer", xlabel="layer", ylabel="rel. L2 vs dense")
    error_axes.legend()

    # Pass-key accuracy per placement (the question after the text, or before it), each over every
    # length and depth of the grid.
    placements = ["after", "before"]
    accuracy = {(spec, placement): next(row["value"] for row in rows if row["spec"] == spec
                                        and row["task"] == "passkey" and row["metric"] == "accuracy"
                                        and row["placement"] == placement and row["length"] is None
                                        and row["depth"] is None)
                for spec in SPECS for placement in placements}
    width = 0.38
    for offset, placement in zip((-width / 2, width / 2), placements):
        accuracy_axes.bar([i + offset for i in range(len(SPECS))], [accuracy[spec, placement] for spec in SPECS],
                          width, label=f"question {placement}")
    accuracy_axes.set_xticks(range(len(SPECS)), SPECS)
    accuracy_axes.set(title=f"pass-key accuracy (up to {args.context} tokens)", ylabel="accuracy", ylim=(0, 1.05))
    accuracy_axes.legend(loc="lower right")
    bytes_axes.bar(SPECS, [bytes_per_token[spec] for spec in SPECS], color=["C0", "C1", "C2"])
    bytes_axes.set(title="sealed KV bytes per token", ylabel="bytes")
    figure.suptitle(f"slimkv: KV specs on {os.path.basename(args.model)}")
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    for spec in SPECS:
        print(f"{spec:14s} pass-key accuracy {accuracy[spec, 'after']:.2f} (question after), "
              f"{accuracy[spec, 'before']:.2f} (before)   sealed bytes/token {bytes_per_token[spec]:.0f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
