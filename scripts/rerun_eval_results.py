#!/usr/bin/python3
"""Re-measures the committed `slimkv eval` results with the commands that made them: each
docs/results/**/results.json records its specs, tasks, samples, context, text, filler and device, and this
script turns it back into the `slimkv eval` command that writes the same directory (for a new bundled
model, or after a change to a codec). Only the model and, where asked, the context change.

    scripts/rerun_eval_results.py --list                       # the commands, one per results.json
    scripts/rerun_eval_results.py --run --threads 16 [--only hack/ppl,quality] [--device cpu|cuda]
        [--model models/slimkv-llama-15m] [--context-map 4096=0] [--no-plots] [--jobs 4]

`--context-map OLD=NEW` replaces a recorded context (0: the model's full context) — used when the bundled
model's context grew and the tables ran "at the model's full context". Rows of a results.json that is
not a slimkv eval result (no "settings") are skipped.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def eval_results(root):
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.startswith("results") and name.endswith(".json"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    data = json.load(f)
                if "settings" in data and "specs" in data:
                    yield path, data


def command_for(path, data, args):
    settings = data["settings"]
    out = os.path.relpath(os.path.dirname(path), REPO)
    context = settings.get("context", 0)
    context = args.context_map.get(context, context)
    samples = settings.get("samples", 0)
    if isinstance(samples, dict):
        samples = ",".join("%s=%d" % (task, n) for task, n in sorted(samples.items()))
    cmd = [args.slimkv, "eval", "--model", args.model, "--kv", ",".join(data["specs"]),
           "--tasks", ",".join(data["tasks"]), "--out", out, "--seed", str(data.get("seed", 0))]
    if context:
        cmd += ["--context", str(context)]
    if samples:
        cmd += ["--samples", str(samples)]
    if settings.get("filler"):
        cmd += ["--filler", settings["filler"]]
    device = args.device or settings.get("device", "cpu")
    cmd += ["--device", device, "--threads", str(args.threads)]
    if args.no_plots:
        cmd.append("--no-plots")
    # A second result file in one folder (results_rot_hadamard.json) is written elsewhere, then moved.
    if os.path.basename(path) != "results.json":
        cmd[cmd.index("--out") + 1] = out + "/" + os.path.basename(path)[:-5]
    return out, os.path.basename(path), cmd


def run_one(entry, log_dir):
    out, name, cmd = entry
    log = os.path.join(log_dir, (out + "_" + name).replace("/", "_") + ".log")
    start = time.time()
    with open(log, "w") as f:
        code = subprocess.call(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    if code == 0 and name != "results.json":
        produced = os.path.join(REPO, cmd[cmd.index("--out") + 1])
        os.replace(os.path.join(produced, "results.json"), os.path.join(REPO, out, name))
    return out, name, code, time.time() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated result folders under docs/results")
    ap.add_argument("--model", default="models/slimkv-llama-15m")
    ap.add_argument("--slimkv", default="build/release/slimkv")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="")
    ap.add_argument("--context-map", default="")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--logs", default="/tmp/rerun_eval_logs")
    args = ap.parse_args()
    args.context_map = {int(a): int(b) for a, b in (p.split("=") for p in args.context_map.split(",") if p)}
    only = {o.strip("/") for o in args.only.split(",") if o}
    entries = [command_for(path, data, args) for path, data in eval_results(os.path.join(REPO, "docs/results"))]
    entries = [e for e in entries if not only or os.path.relpath(e[0], "docs/results") in only]
    if args.list or not args.run:
        for _, _, cmd in entries:
            print(" ".join("'%s'" % c if ";" in c or " " in c else c for c in cmd))
        return 0
    os.makedirs(args.logs, exist_ok=True)
    # Longest first (specs x tasks as the measure), so that parallel jobs end together.
    entries.sort(key=lambda e: -len(e[2][e[2].index("--kv") + 1].split(",")) * len(e[2][e[2].index("--tasks") + 1].split(",")))
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for out, name, code, seconds in pool.map(lambda e: run_one(e, args.logs), entries):
            print("%-45s %-28s %s  %.0f s" % (out, name, "ok" if code == 0 else "FAILED (%d)" % code, seconds), flush=True)
            failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
