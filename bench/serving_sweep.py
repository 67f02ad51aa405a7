#!/usr/bin/env python3
"""A regime sweep of slimkv serve: one server per setting (KV spec, KV memory, prefill chunk...) in turn on
loopback, bench/serving_benchmark.py against each for the plan's runs (all at once or Poisson arrivals;
output lengths), then a table of every run: request throughput, TPOT, ITL, TTFT, the concurrency held, and
each run's ratios to the run it names as its baseline (dense in the same regime).

A plan is JSON: a list of servers, each {"name", "serve": [slimkv serve flags], "runs": [{"label",
"bench": [serving_benchmark.py flags], "compare": "SERVER/LABEL" (optional), "rate_times": X and
"rate_of": "SERVER/LABEL" (optional: Poisson arrivals at X times that run's measured request throughput,
e.g. 3x dense's, to compare TPOT at that throughput), "expect_s": seconds it is expected to take}]}.
--serve-args and --bench-args are added to every server and run. The sweep is bounded in time: a run
starts only while --deadline-s leaves it its expect_s (default --min-run-s), and is cut at the deadline;
what was skipped or cut is listed. Results: OUT/SERVER__LABEL.json (and .txt),
OUT/SERVER.log, OUT/summary.json; --table-only reprints the table from them.

  bench/serving_sweep.py --slimkv build/release/slimkv --model models/slimkv-llama-15m --out /tmp/sweep \\
      --plan plan.json --bench-args "--input-len 1024 --range-ratio 0" --deadline-s 600

Python 3 standard library only.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "serve"))
from slimkv_server import Process  # noqa: E402


def check_plan(plan):
    """Names the first field of the plan that is missing or of the wrong type."""
    if not isinstance(plan, list) or not plan:
        sys.exit("error: the plan must be a non-empty JSON list of servers")
    names = set()
    for i, server in enumerate(plan):
        for field, kind in (("name", str), ("serve", list), ("runs", list)):
            if not isinstance(server.get(field), kind):
                sys.exit(f"error: plan server {i}: field '{field}' must be a {kind.__name__}")
        for j, run in enumerate(server["runs"]):
            if not isinstance(run.get("label"), str) or not isinstance(run.get("bench", []), list):
                sys.exit(f"error: plan server '{server['name']}' run {j}: 'label' (string) and 'bench' (list) expected")
            names.add(f"{server['name']}/{run['label']}")
            for field in ("compare", "rate_of"):
                if field in run and run[field] not in names:
                    sys.exit(f"error: run '{server['name']}/{run['label']}': {field} '{run[field]}' is not an earlier run")
            if ("rate_of" in run) != ("rate_times" in run):
                sys.exit(f"error: run '{server['name']}/{run['label']}': rate_of and rate_times go together")


def result_path(out, key, ext):
    return os.path.join(out, key.replace("/", "__") + ext)


class Notes(list):
    """What the table's reader must know (load times, skipped runs, the servers' KV figures), printed as it
    comes so that a log cut short still has it."""

    def add(self, text):
        self.append(text)
        print("note:", text, flush=True)


def run_server(args, server, results, notes, deadline):
    """Starts one server, runs its runs while time is left, stops it; keeps its log in OUT."""
    if deadline - time.time() < args.min_run_s:
        notes.add(f"{server['name']}: skipped (no time left)")
        return
    serve_flags = shlex.split(args.serve_args) + server["serve"]
    command = [args.slimkv, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0"] + serve_flags
    started = time.time()
    process = Process(command, ready_timeout_s=max(1, deadline - time.time()), name=f"slimkv-{server['name']}")
    try:
        process.__enter__()
    except RuntimeError as e:
        notes.add(f"{server['name']}: did not start: {str(e).splitlines()[0]}")
        with open(os.path.join(args.out, server["name"] + ".log"), "w") as f:
            f.write(str(e))
        if process.process.poll() is None:
            process.kill()
        process.__exit__(None, None, None)
        return
    notes.add(f"{server['name']}: ready in {time.time() - started:.1f} s")
    try:
        # One short request first: the first step's one-time costs (kernel loading, GEMM plans) are not a run's.
        process.post("/v1/completions", {"prompt": [11, 12, 13, 14], "max_tokens": 4, "ignore_eos": True})
        for run in server["runs"]:
            key = f"{server['name']}/{run['label']}"
            bench = shlex.split(args.bench_args) + run.get("bench", [])
            if "rate_of" in run:
                base = results.get(run["rate_of"])
                if base is None:
                    notes.add(f"{key}: skipped ({run['rate_of']} has no result to take the rate from)")
                    continue
                bench += ["--request-rate", f"{run['rate_times'] * base['request_throughput']:.4f}"]
            left = deadline - time.time()
            if left < run.get("expect_s", args.min_run_s):
                notes.add(f"{key}: skipped (no time left)")
                continue
            command = [sys.executable, os.path.join(HERE, "serving_benchmark.py"), "--url", process.url,
                       "--label", key, "--json", result_path(args.out, key, ".json")] + bench
            with open(result_path(args.out, key, ".txt"), "w") as log:
                try:
                    subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=left)
                except subprocess.TimeoutExpired:
                    notes.add(f"{key}: cut at the deadline")
                    continue
            if not os.path.exists(result_path(args.out, key, ".json")):
                notes.add(f"{key}: no result (its .txt says why)")
                continue
            with open(result_path(args.out, key, ".json")) as f:
                result = json.load(f)
            result.update(server=server["name"], run=run["label"], serve_args=serve_flags, bench_args=bench,
                          compare=run.get("compare"))
            results[key] = result
            print(f"{key}: {result['request_throughput']:.3f} req/s, mean TPOT {result['mean_tpot_ms']:.1f} ms, "
                  f"mean running {result['mean_running']:.1f}", flush=True)
        status, _, metrics = process.get("/metrics")
        if status == 200:
            for line in metrics.decode().splitlines():
                if line.startswith(("slimkv:kv_cache_bytes_per_token", "slimkv:kv_cache_capacity_bytes",
                                    "slimkv:num_preemptions_total")):
                    notes.add(f"{server['name']}: {line}")
    finally:
        with open(os.path.join(args.out, server["name"] + ".log"), "w") as f:
            f.write(process.output())
        try:
            process.stop(timeout_s=15)
        except subprocess.TimeoutExpired:
            process.kill()
        process.__exit__(None, None, None)


def print_table(results, notes):
    columns = [("run", None), ("req/s", "request_throughput"), ("vs base", "ratio_throughput"),
               ("mean run", "mean_running"), ("max run", "max_running"), ("mean TPOT ms", "mean_tpot_ms"),
               ("vs base", "ratio_tpot"), ("p50 ITL ms", "p50_itl_ms"), ("p99 ITL ms", "p99_itl_ms"),
               ("mean TTFT ms", "mean_ttft_ms"), ("rate", "request_rate"), ("n", "completed"), ("err", "errors")]
    print("| " + " | ".join(title for title, _ in columns) + " |")
    print("|---" * len(columns) + "|")
    for key, result in results.items():
        base = results.get(result.get("compare") or "")
        cells = []
        for title, field in columns:
            if field is None:
                cells.append(key)
            elif field.startswith("ratio_"):
                name = {"ratio_throughput": "request_throughput", "ratio_tpot": "mean_tpot_ms"}[field]
                cells.append(f"{result[name] / base[name]:.2f}x" if base and base[name] else "")
            elif field == "request_rate":
                cells.append("all" if result[field] == float("inf") else f"{result[field]:.3f}")
            else:
                value = result[field]
                cells.append(f"{value:.0f}" if isinstance(value, int) or abs(value) >= 100 else f"{value:.2f}")
        print("| " + " | ".join(cells) + " |")
    for note in notes:
        print("note:", note)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slimkv", help="the slimkv binary")
    parser.add_argument("--model", help="the model directory every server loads")
    parser.add_argument("--plan", help="the plan (JSON, see above)")
    parser.add_argument("--out", required=True, help="directory for the results (created)")
    parser.add_argument("--serve-args", default="", help="flags added to every slimkv serve")
    parser.add_argument("--bench-args", default="", help="flags added to every serving_benchmark.py run")
    parser.add_argument("--deadline-s", type=float, default=600, help="the whole sweep ends within this")
    parser.add_argument("--min-run-s", type=float, default=20, help="a run starts only with this much time left")
    parser.add_argument("--table-only", action="store_true", help="print the table of OUT/summary.json")
    args = parser.parse_args()
    summary = os.path.join(args.out, "summary.json")
    if args.table_only:
        with open(summary) as f:
            saved = json.load(f)
        print_table(saved["results"], saved["notes"])
        return 0
    for flag in ("slimkv", "model", "plan"):
        if getattr(args, flag) is None:
            sys.exit(f"error: --{flag} is required (unless --table-only)")
    with open(args.plan) as f:
        plan = json.load(f)
    check_plan(plan)
    os.makedirs(args.out, exist_ok=True)
    deadline = time.time() + args.deadline_s
    results, notes = {}, Notes()
    for server in plan:
        try:
            run_server(args, server, results, notes, deadline)
        except Exception as e:  # noqa: BLE001 - one server's failure must not lose the other servers' runs
            notes.add(f"{server['name']}: failed: {e!r}")
        with open(summary, "w") as f:  # after every server: a sweep cut short keeps what it measured
            json.dump({"plan": plan, "results": results, "notes": notes}, f, indent=1)
    print_table(results, notes)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
