#!/usr/bin/env python3
"""Where the last STEPS decode steps' time went, from a trace of bench/cuda/step_trace (a step ends with
the kernel that picks the next tokens: argmax or sampling): milliseconds per step, the GPU's busy share
and its idle gaps between kernels, how long each kernel waited after its launch call (large: the CPU is
ahead and the GPU is the bottleneck; near zero: the GPU waits for launches), the CUDA runtime's time
per step, and the kernels by time per step. STEPS `all`: every step of the trace (a server's), the time
between steps more than 20 ms apart (an idle server) left out of the span.

Usage: step_trace_summary.py TRACE.csv [STEPS (16) | all]"""
import collections
import sys

IDLE_NS = 20_000_000  # no kernel for this long: no step was running


def main():
    path, steps = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "16"
    kernels, launches, copies = [], {}, []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split(",", 5)
            if len(parts) < 6:
                continue
            kind, start, end, correlation, what = parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[5]
            if kind == "K":
                kernels.append((start, end, correlation, what))
            elif kind == "R":
                launches[correlation] = (start, end)
            elif kind == "M":
                copies.append((start, what))
    kernels.sort()
    step_ends = [i for i, k in enumerate(kernels) if "argmax" in k[3] or "sample" in k[3]]
    steps = len(step_ends) - 1 if steps == "all" else int(steps)
    if steps < 1 or len(step_ends) < steps + 1:
        sys.exit(f"{path}: {len(step_ends)} steps traced, {steps + 1} needed")
    window = kernels[step_ends[-steps - 1] + 1:step_ends[-1] + 1]
    t0, t1 = window[0][0], window[-1][1]
    busy, last_end, gaps, idle = 0, t0, [], 0
    for start, end, _, _ in window:
        if start - last_end > IDLE_NS:
            idle += start - last_end
        elif start > last_end:
            gaps.append((start - last_end, len(gaps)))
        busy += max(0, end - max(start, last_end))
        last_end = max(last_end, end)
    span = t1 - t0 - idle
    print(f"{steps} steps: {span / steps / 1e6:.3f} ms/step; GPU busy {busy / span:.3f}; {len(window) / steps:.0f} kernels "
          f"and {sum(g for g, _ in gaps) / steps / 1e6:.3f} ms of gaps between them per step")
    waits = sorted(k[0] - launches[k[2]][1] for k in window if k[2] in launches)
    if waits:
        at = lambda q: waits[int(q * (len(waits) - 1))] / 1e3
        print(f"kernel start after its launch call (us): p10 {at(0.1):.1f}, median {at(0.5):.1f}, p90 {at(0.9):.1f}")
    runtime = sum(end - start for start, end in launches.values() if t0 <= start <= t1)
    in_window = [what for start, what in copies if t0 <= start <= t1]
    print(f"CUDA runtime calls {runtime / steps / 1e6:.3f} ms/step; memory copies per step {len(in_window) / steps:.1f}")
    by_kernel = collections.defaultdict(lambda: [0, 0])
    for start, end, _, name in window:
        by_kernel[name][0] += end - start
        by_kernel[name][1] += 1
    print(f"{'us/step':>9} {'calls':>6} {'us/call':>8}  kernel")
    for name, (total, count) in sorted(by_kernel.items(), key=lambda item: -item[1][0]):
        print(f"{total / steps / 1e3:9.1f} {count / steps:6.1f} {total / count / 1e3:8.2f}  {name[:100]}")


if __name__ == "__main__":
    main()
