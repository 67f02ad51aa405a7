#!/usr/bin/env python3
"""Instruction mix of a kernel per unit of work, from ncu's source page (SASS, CSV).

  ncu --set full --launch-count 1 --kernel-name regex:hack_prefill_partials -o hack -f \\
      build/release/bench_hack_prefill_cuda --batches 8 --contexts 32768 --queries 512 --repetitions 1
  ncu --import hack.ncu-rep --page source --print-source sass --csv > hack.csv
  bench/cuda/ncu_instruction_mix.py hack.csv --unit-opcode IMMA --per-unit 64

A unit is what `per-unit` instructions of `unit-opcode` do (64 IMMA: one 16-row tile over one
64-token block in the INT8 prefill kernel; 128 HMMA in the FP16 one): the counts are divided by the
number of units, so kernels of different tiles and mma shapes compare per the same work.
"""
import argparse
import collections
import csv


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--unit-opcode", required=True, help="the opcode that counts the work, e.g. IMMA or HMMA")
    parser.add_argument("--per-unit", type=float, required=True, help="instructions of that opcode per unit")
    parser.add_argument("--top", type=int, default=24)
    args = parser.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header = next(r for r in rows if "Source" in r and "Instructions Executed" in r)
    source, executed = header.index("Source"), header.index("Instructions Executed")
    counts = collections.Counter()
    for row in rows[rows.index(header) + 1:]:
        if len(row) <= executed or not row[source].strip():
            continue
        tokens = row[source].split()
        opcode = tokens[1] if tokens[0].startswith("@") else tokens[0]
        counts[opcode.split(".")[0]] += int(row[executed] or 0)
    if counts[args.unit_opcode] == 0:
        raise SystemExit(f"{args.csv}: no {args.unit_opcode} instruction executed")
    units = counts[args.unit_opcode] / args.per_unit
    total = sum(counts.values())
    print(f"{args.csv}: {units:.0f} units, {total / units:.0f} instructions per unit")
    for opcode, count in counts.most_common(args.top):
        print(f"  {opcode:8s} {count / units:8.1f}")


if __name__ == "__main__":
    main()
