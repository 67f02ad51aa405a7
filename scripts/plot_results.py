#!/usr/bin/python3
"""Draws the plots the docs show, from result files committed under docs/results/ (nothing is measured
here; each source file's page gives the command, date, machine and commit that produced it):

  docs/results/frontier.png          perplexity cost against KV bytes, one series per technique
                                     (hack/ppl + memory, zack_vr0, pq_speed + pq_memory results.json)
  docs/results/decode_vs_context.png decode attention time against context per codec: CPU
                                     (cpu/bench_kernels_decode.csv) and GPU (cuda/decode_attention_vs_sdpa.txt)
  docs/results/hack/passkey.png      pass key found by prompt length and needle depth, per spec
                                     (hack/passkey/results.json)
  docs/results/kvpr/kvpr_split.png   KVPR: time per layer against the split, measured and predicted
                                     (kvpr/sweep_h100.csv)

Usage: /usr/bin/python3 scripts/plot_results.py [REPO]     (needs Debian's python3-matplotlib:
       sudo apt-get install -y python3-matplotlib; not part of `make test`)
"""
import csv
import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

# PNG metadata would otherwise carry matplotlib's version and a date, so every run would change the file.
PNG_METADATA = {"Software": None}


def load_eval(path):
    """{(spec, metric): value} of a slimkv eval results.json, the untiered rows only."""
    with open(path) as f:
        results = json.load(f)["results"]
    return {(r["spec"], r["metric"]): r["value"] for r in results if "tier" not in r and "depth" not in r}


def save(figure, path):
    figure.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(figure)
    print("wrote", path)


def frontier(results, out):
    """Δ decode perplexity (% of the run's own dense) against KV bytes / FP16, per technique."""
    hack_ppl = load_eval(os.path.join(results, "hack/ppl/results.json"))
    memory = load_eval(os.path.join(results, "memory/results.json"))
    zack = load_eval(os.path.join(results, "zack_vr0/results.json"))
    pq = load_eval(os.path.join(results, "pq_speed/results.json"))
    pq_memory = load_eval(os.path.join(results, "pq_memory/results.json"))
    with open(os.path.join(results, "hack/ppl/results.json")) as f:
        hack_run = json.load(f)
    with open(os.path.join(results, "memory/results.json")) as f:
        memory_run = json.load(f)
    canonical = dict(zip(hack_run["specs"], hack_run["specs_canonical"]))
    # Bytes by canonical spec, rounding aside (it changes values, not sizes): the memory run names its
    # specs its own way.
    same_bytes = lambda spec: spec.replace("round=stochastic", "round=nearest")
    ratio_by_canonical = {same_bytes(c): memory[(s, "ratio_fp16")]
                          for s, c in zip(memory_run["specs"], memory_run["specs_canonical"])}

    def delta(table, spec):
        return 100.0 * (table[(spec, "ppl")] / table[("dense", "ppl")] - 1.0)

    series = defaultdict(list)  # technique -> [(ratio, delta, label)]
    for spec in hack_run["specs"]:
        if spec == "dense":
            continue
        rounding = "stochastic" if "round=stochastic" in canonical[spec] else "nearest"
        label = spec.replace(",round=nearest", "") + ("" if rounding == "nearest" else " (stochastic)")
        series[spec.split(":")[0]].append((ratio_by_canonical[same_bytes(canonical[spec])], delta(hack_ppl, spec), label))
    for spec in sorted({s for s, _ in zack if s.startswith("zack")}):
        technique = "zack+hack" if "+hack" in spec else "zack"
        series[technique].append((zack[(spec, "ratio_fp16")], delta(zack, spec), spec.replace(",vr=0", "")))
    # Only the specs whose bytes pq_memory measured (it has oracle at one top-k).
    for spec in sorted({s for s, _ in pq if s.startswith(("pq", "oracle")) and (s, "ratio_fp16") in pq_memory}):
        series["pq" if spec.startswith("pq") else "oracle"].append((pq_memory[(spec, "ratio_fp16")], delta(pq, spec), spec))

    figure, axes = plt.subplots(figsize=(9, 5.5))
    markers = {"hack": "o", "quant": "s", "zack": "^", "zack+hack": "v", "pq": "D", "oracle": "d"}
    for technique, points in series.items():
        points.sort()
        axes.plot([p[0] for p in points], [p[1] for p in points], markers[technique], label=technique, markersize=7)
        below = technique in ("quant", "oracle")  # labels that would sit on a neighbour's
        for x, y, label in points:
            axes.annotate(label, (x, y), fontsize=6.5, xytext=(4, -9 if below else 3), textcoords="offset points")
    axes.axhline(0, color="grey", linewidth=0.8)
    axes.axvline(1, color="grey", linewidth=0.8, linestyle=":")
    axes.set_xscale("log")
    axes.set_yscale("symlog", linthresh=1)
    axes.set_ylim(-0.5, 400)
    ticks = [0.2, 0.3, 0.5, 1, 2]
    axes.set_xticks(ticks, [str(t) for t in ticks])
    axes.set_xlabel("KV bytes per token / FP16's (log; dense FP32 = 2)")
    axes.set_ylabel("decode perplexity vs dense, % (symlog)")
    axes.set_title("Quality against KV size, bundled 15M model (zack: 2048 tokens; others: 4096)", fontsize=10)
    axes.legend(fontsize=8)
    axes.grid(True, which="both", alpha=0.3)
    save(figure, out)


def read_sdpa_table(path):
    """{column: [values]} of the side-by-side table at the end of decode_attention_vs_sdpa.txt, whose
    first five columns are context, SDPA ms, dense ms, quant ms, hack ms."""
    with open(path) as f:
        lines = f.read().splitlines()
    start = max(i for i, line in enumerate(lines) if line.split()[:2] == ["context", "SDPA"])
    columns = defaultdict(list)
    for line in lines[start + 1:]:
        words = line.split()
        if not words or not words[0].isdigit():
            break
        for name, word in zip(["context", "SDPA", "dense", "quant", "hack"], words):
            columns[name].append(float(word))
    return columns


def decode_vs_context(results, out):
    figure, (cpu_axes, gpu_axes) = plt.subplots(1, 2, figsize=(11, 4.5))
    with open(os.path.join(results, "cpu/bench_kernels_decode.csv")) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    contexts = [int(r["context"]) for r in rows]
    for column, label in [("dense_f32", "dense FP32"), ("dense_f16", "dense FP16"), ("quant_2bit", "quant 2-bit"),
                          ("hack_2bit", "hack 2-bit")]:
        cpu_axes.plot(contexts, [float(r[column]) for r in rows], "o-", label=label)
    cpu_axes.set_title("CPU: 2-core EPYC VM, 2 threads (bench_kernels)", fontsize=10)
    gpu = read_sdpa_table(os.path.join(results, "cuda/decode_attention_vs_sdpa.txt"))
    for column, label in [("SDPA", "PyTorch SDPA FP16"), ("dense", "slimkv dense FP16"), ("quant", "quant 2-bit"),
                          ("hack", "hack 2-bit")]:
        gpu_axes.plot(gpu["context"], gpu[column], "o-", label=label)
    gpu_axes.set_title("GPU: H100, batch 8 (decode_attention_vs_sdpa.py)", fontsize=10)
    for axes in (cpu_axes, gpu_axes):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("context (tokens)")
        axes.set_ylabel("ms per decode step (attention, 32 q / 8 KV heads, d 128)")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    save(figure, out)


def passkey_heatmaps(path, out):
    with open(path) as f:
        run = json.load(f)
    cells = defaultdict(dict)
    for r in run["results"]:
        if r["task"] == "passkey" and r.get("placement") == "after" and "depth" in r:
            cells[r["spec"]][(r["length"], r["depth"])] = r["value"]
    specs = [s for s in run["specs"] if s in cells]
    lengths = sorted({length for spec in specs for length, _ in cells[spec]})
    depths = sorted({depth for spec in specs for _, depth in cells[spec]})
    canonical = dict(zip(run["specs"], run["specs_canonical"]))
    columns = 3
    rows = (len(specs) + columns - 1) // columns
    figure, axes_grid = plt.subplots(rows, columns, figsize=(10, 3.2 * rows), squeeze=False)
    for axes in axes_grid.flat[len(specs):]:
        axes.axis("off")
    for axes, spec in zip(axes_grid.flat, specs):
        grid = [[cells[spec].get((length, depth), float("nan")) for depth in depths] for length in lengths]
        image = axes.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
        label = spec + (" (stochastic)" if "round=stochastic" in canonical[spec] and "round=" not in spec else "")
        found = sum(cells[spec].values()) / len(cells[spec])
        axes.set_title(f"{label}\n{found:.0%} found", fontsize=8)
        axes.set_xticks(range(len(depths)), [f"{d:.0%}" for d in depths], fontsize=6, rotation=90)
        axes.set_yticks(range(len(lengths)), [str(length) for length in lengths], fontsize=7)
        axes.set_xlabel("needle depth", fontsize=7)
        axes.set_ylabel("prompt tokens", fontsize=7)
    figure.suptitle("Pass key (question after the text), bundled model, prefill=exact", fontsize=10)
    figure.tight_layout()
    figure.colorbar(image, ax=list(axes_grid.flat), shrink=0.6, label="found")
    save(figure, out)


def kvpr_split(path, out):
    with open(path) as f:
        groups = defaultdict(list)
        for row in csv.DictReader(f):
            groups[f'{row["shape"]}, {int(row["context"]) // 1024}K x {row["batch"]}'].append(row)
    figure, axes_row = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for axes, (title, rows) in zip(axes_row[0], groups.items()):
        splits = [float(r["split"]) for r in rows]
        axes.plot(splits, [float(r["measured_layer_ms"]) for r in rows], "o-", label="measured")
        axes.plot(splits, [float(r["predicted_layer_ms"]) for r in rows], "s--", label="cost model")
        axes.set_title(f"KVPR split sweep, {title} (H100)", fontsize=10)
        axes.set_xlabel("recomputed share of the tokens (split l / s)")
        axes.set_ylabel("ms per layer")
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.tight_layout()
    save(figure, out)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = os.path.join(root, "docs", "results")
    frontier(results, os.path.join(results, "frontier.png"))
    decode_vs_context(results, os.path.join(results, "decode_vs_context.png"))
    passkey_heatmaps(os.path.join(results, "hack/passkey/results.json"), os.path.join(results, "hack/passkey.png"))
    kvpr_split(os.path.join(results, "kvpr/sweep_h100.csv"), os.path.join(results, "kvpr/kvpr_split.png"))


if __name__ == "__main__":
    main()
