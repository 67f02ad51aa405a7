#!/usr/bin/env python3
"""Plots bench_kvpr_cuda's --csv (time per layer against the split: measured, and the cost model's
prediction) as an SVG, one panel per shape/config. Standard library only.

    python3 bench/cuda/plot_kvpr_sweep.py docs/results/kvpr/sweep_h100.csv docs/results/kvpr/sweep_h100.svg
"""
import csv
import sys
from collections import defaultdict

W, H, PAD = 420, 300, 50


def panel(rows, title, x0):
    xs = [float(r["split"]) for r in rows]
    series = {"measured": [float(r["measured_layer_ms"]) for r in rows],
              "cost model": [float(r["predicted_layer_ms"]) for r in rows]}
    top = max(max(v) for v in series.values()) * 1.1
    px = lambda x: x0 + PAD + x * (W - 2 * PAD)
    py = lambda y: H - PAD - y / top * (H - 2 * PAD)
    out = [f'<text x="{x0 + W / 2}" y="20" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(1)}" y2="{py(0)}" stroke="black"/>',
           f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(0)}" y2="{py(top)}" stroke="black"/>',
           f'<text x="{x0 + W / 2}" y="{H - 12}" text-anchor="middle" font-size="11">split l / s</text>',
           f'<text x="{x0 + 12}" y="{H / 2}" font-size="11" transform="rotate(-90 {x0 + 12} {H / 2})" '
           f'text-anchor="middle">ms per layer</text>']
    for i in range(5):
        y = top * i / 4
        out.append(f'<text x="{px(0) - 4}" y="{py(y) + 4}" text-anchor="end" font-size="10">{y:.2f}</text>')
        x = i / 4
        out.append(f'<text x="{px(x)}" y="{py(0) + 14}" text-anchor="middle" font-size="10">{x:.2f}</text>')
    for (name, ys), color in zip(series.items(), ["#1f77b4", "#d62728"]):
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
        dash = ' stroke-dasharray="5,3"' if name == "cost model" else ""
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        ly = 40 + 16 * list(series).index(name)
        out.append(f'<line x1="{x0 + W - 140}" y1="{ly}" x2="{x0 + W - 115}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{x0 + W - 110}" y="{ly + 4}" font-size="11">{name}</text>')
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    groups = defaultdict(list)
    with open(sys.argv[1]) as f:
        for row in csv.DictReader(f):
            groups[f'{row["shape"]} {row["context"]}x{row["batch"]}'].append(row)
    parts = []
    for i, (title, rows) in enumerate(groups.items()):
        parts += panel(rows, title, i * W)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(groups)}" height="{H}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>' + "".join(parts) + "</svg>")
    with open(sys.argv[2], "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
