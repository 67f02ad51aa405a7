#!/usr/bin/env python3
"""The GPU work of each process traced by bench/cuda/step_trace (SLIMKV_TRACE_OUT=trace_%p.csv: one file a
process, e.g. a disaggregated benchmark's workers): its bursts of kernels (split at 20 ms without one),
each with its span, the busy time of compute kernels, NCCL's kernels and the KV copies (copy_pieces), and
the CUDA runtime calls that took time, by name (CUPTI's callback ids read from cupti_runtime_cbid.h when
the toolkit has it). A burst whose span is much longer than its compute time is a GPU waiting for its
host: the runtime calls say on what. Then the burst's longest idle gaps between compute kernels, each with
the NCCL kernels running during it and the runtime calls (name@thread) that covered it, and which calls
of which thread covered the gaps in all: what the compute thread was waiting in while its GPU idled.
Last, the runtime calls over 1 ms that ended as an earlier-started call of another thread did (within
0.2 ms): a call that waited behind that one, i.e. for a lock of the driver it held.

Usage: step_trace_processes.py 'TRACE_GLOB' [CUPTI_RUNTIME_CBID_H]"""
import bisect
import csv
import glob
import os
import re
import sys

GAP_NS = 20_000_000


def runtime_names(header):
    """CUPTI's runtime callback ids → call names, from its header (empty without it)."""
    names = {}
    if header and os.path.exists(header):
        with open(header) as f:
            for match in re.finditer(r"CUPTI_RUNTIME_TRACE_CBID_(\w+?)(?:_v\d+)?\s*=\s*(\d+)", f.read()):
                names.setdefault(match.group(2), match.group(1))
    return names


GAP_SHOWN_NS = 2_000_000


def read(path):
    """Kernels and copies (start, end, K|M, what, stream); runtime calls (start, end, cbid, thread)."""
    work, calls = [], []
    with open(path) as f:
        for row in csv.reader(f):
            if len(row) < 6:
                continue
            start, end = int(row[1]), int(row[2])
            if row[0] in ("K", "M"):
                work.append((start, end, row[0], row[5], row[4]))
            elif row[0] == "R":
                calls.append((start, end, row[5], row[4]))
    work.sort()
    calls.sort()
    return work, calls


def by_name(calls):
    out = {}
    for start, end, cbid, _ in calls:
        count, total, longest = out.get(cbid, (0, 0, 0))
        out[cbid] = (count + 1, total + end - start, max(longest, end - start))
    return out


def overlap(a_start, a_end, b_start, b_end):
    return max(0, min(a_end, b_end) - max(a_start, b_start))


def show_gaps(burst, calls, names):
    """The GPU's idle gaps between compute kernels in a burst, and what covered them."""
    compute = [w for w in burst if w[2] == "K" and "nccl" not in w[3].lower()]
    nccl = [w for w in burst if w[2] == "K" and "nccl" in w[3].lower()]
    if not compute:
        return
    gaps, last_end = [], compute[0][1]
    for start, end, *_ in compute[1:]:
        if start - last_end > GAP_SHOWN_NS:
            gaps.append((last_end, start))
        last_end = max(last_end, end)
    if not gaps:
        return
    covered = {}
    print(f"  its {len(gaps)} gaps over {GAP_SHOWN_NS / 1e6:.0f} ms between compute kernels: {sum(b - a for a, b in gaps) / 1e6:.1f} ms")
    for gap_start, gap_end in gaps:
        for start, end, cbid, thread in calls:
            if start < gap_end and end > gap_start:
                key = f"{names.get(cbid, 'cbid ' + cbid)}@{thread}"
                covered[key] = covered.get(key, 0) + overlap(start, end, gap_start, gap_end)
    for gap_start, gap_end in sorted(gaps, key=lambda g: g[0] - g[1])[:10]:
        in_nccl = sum(overlap(w[0], w[1], gap_start, gap_end) for w in nccl)
        long_calls = [f"{names.get(cbid, 'cbid ' + cbid)}@{thread} {overlap(start, end, gap_start, gap_end) / 1e6:.1f}"
                      for start, end, cbid, thread in calls
                      if overlap(start, end, gap_start, gap_end) > (gap_end - gap_start) // 4]
        print(f"    at {(gap_start - burst[0][0]) / 1e6:8.1f} ms: {(gap_end - gap_start) / 1e6:6.1f} ms idle, NCCL kernels "
              f"{in_nccl / 1e6:.1f} ms of it; calls: {', '.join(long_calls[:6]) or '-'}")
    print("    calls covering the gaps (ms of gap): " +
          ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(covered.items(), key=lambda kv: -kv[1])[:8]))


def bursts(work):
    out, current, current_end = [], [], 0
    for item in work:
        if current and item[0] - current_end > GAP_NS:
            out.append(current)
            current = []
        current.append(item)
        current_end = max(current_end, item[1]) if len(current) > 1 else item[1]
    return out + ([current] if current else [])


def show_waits_behind(calls, names):
    """Calls over 1 ms that ended with an earlier call of another thread: which calls wait behind which."""
    ends = sorted((end, cbid, thread, start) for start, end, cbid, thread in calls)
    keys = [item[0] for item in ends]
    behind, slow = {}, 0
    for start, end, cbid, thread in calls:
        if end - start < 1_000_000:
            continue
        slow += 1
        i = bisect.bisect_left(keys, end - 200_000)
        while i < len(ends) and ends[i][0] <= end + 200_000:
            if ends[i][2] != thread and ends[i][3] < start:
                key = f"{names.get(cbid, 'cbid ' + cbid)}@{thread} behind {names.get(ends[i][1], 'cbid ' + ends[i][1])}@{ends[i][2]}"
                behind[key] = behind.get(key, 0) + 1
                break
            i += 1
    if behind:
        print(f"  of {slow} calls over 1 ms, {sum(behind.values())} ended with an earlier call of another thread:")
        for key, count in sorted(behind.items(), key=lambda kv: -kv[1])[:6]:
            print(f"    {count:6d}  {key}")


def main():
    names = runtime_names(sys.argv[2] if len(sys.argv) > 2 else "/usr/local/cuda/include/cupti_runtime_cbid.h")
    for path in sorted(glob.glob(sys.argv[1])):
        work, calls = read(path)
        if not work:
            continue
        print(f"== {os.path.basename(path)}: {len(work)} kernels and copies")
        first = work[0][0]
        for burst in bursts(work):
            kernels = [w for w in burst if w[2] == "K"]
            if len(kernels) < 100:
                continue
            start, end = burst[0][0], max(w[1] for w in burst)
            nccl = [w for w in kernels if "nccl" in w[3].lower()]
            copies = [w for w in kernels if "copy_pieces" in w[3]]
            compute = sum(w[1] - w[0] for w in kernels if "nccl" not in w[3].lower())
            print(f"  at {(start - first) / 1e9:8.3f} s: span {(end - start) / 1e6:9.1f} ms, compute {compute / 1e6:9.1f} ms "
                  f"({len(kernels) - len(nccl)} kernels), NCCL {len(nccl)} kernels {sum(w[1] - w[0] for w in nccl) / 1e6:.1f} ms, "
                  f"KV copies {len(copies)} ({sum(w[1] - w[0] for w in copies) / 1e6:.1f} ms)")
            if end - start > 2 * compute:
                show_gaps(burst, calls, names)
        print("  runtime calls by time: name, count, total ms, longest ms")
        for cbid, (count, total, longest) in sorted(by_name(calls).items(), key=lambda kv: -kv[1][1])[:12]:
            print(f"    {names.get(cbid, 'cbid ' + cbid):<32} {count:8d} {total / 1e6:10.1f} {longest / 1e6:9.2f}")
        show_waits_behind(calls, names)


if __name__ == "__main__":
    main()
