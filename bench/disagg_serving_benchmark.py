#!/usr/bin/env python3
"""Colocated vs disaggregated serving, measured end to end (issue 23; docs/disaggregated.md, "Measured").

Starts, on loopback, a `slimkv serve --role both` server (colocated) and, for each KV spec, a prefill
worker + a decode worker + `slimkv router`, all on one model. Then, for each arrival rate, drives the same
workload through each deployment in turn: Poisson arrivals (seeded), prompts cut from a held-out text
(token ids of its tokenization, lengths uniform in [len*(1-r), len*(1+r)]), outputs of exact lengths
(ignore_eos), every request streamed so that TTFT, TPOT and JCT are timed as the client sees them. A run
is bounded in count (--num-requests) and time (--max-send-s stops the arrivals; --timeout-s per request).
Prints one table per rate (JCT, TTFT, TPOT, median ITL, request throughput) with each deployment's ratios to the
first disaggregated one, and (--calibrate) measures the per-step costs that scripts/disagg_sim.py takes,
then compares its prediction of every disaggregated run (the same arrivals and lengths) with the
measurement.

Deployments get equal cores: the colocated server --threads 2*T, each worker --threads T.

  bench/disagg_serving_benchmark.py --slimkv build/release/slimkv --model models/slimkv-llama-15m \\
      --kv-bandwidth-gbps 1 --rates 0.5,1,2 --num-requests 24 --input-len 2048 --output-len 32 --calibrate

Python 3 standard library only.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "serve"))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from slimkv_server import Process  # noqa: E402
from serving_benchmark import run_request  # noqa: E402
import disagg_sim  # noqa: E402


class Deployment:
    """A colocated server, or prefill + decode workers behind a router; `url` is where clients go."""

    def __init__(self, args, spec, disaggregated):
        self.spec, self.disaggregated = spec, disaggregated
        self.name = Deployment.name_of(spec, disaggregated)
        common = [args.slimkv, "serve", "--model", args.model, "--kv", spec, "--host", "127.0.0.1", "--port", "0",
                  "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
                  "--prefill-chunk-tokens", str(args.prefill_chunk_tokens)] + args.serve_args.split()
        # --two-gpus: the decode worker on the second GPU (its --device cuda made cuda:1); every GPU stays
        # visible to each worker, as NCCL needs. The colocated server and the prefill worker run on the first.
        decode_common = [("cuda:1" if args.two_gpus and i > 0 and common[i - 1] == "--device" else arg)
                         for i, arg in enumerate(common)]
        self.processes = []
        if not disaggregated:
            self.front = self.start(common + ["--threads", str(2 * args.threads)], "colocated")
            return
        self.prefill = self.start(common + ["--threads", str(args.threads), "--role", "prefill",
                                            "--kv-bandwidth-gbps", str(args.kv_bandwidth_gbps)], "prefill")
        self.decode = self.start(decode_common + ["--threads", str(args.threads), "--role", "decode", "--kv-port", "0"],
                                 "decode")
        self.front = self.start([args.slimkv, "router", "--port", "0", "--prefill", self.prefill.url,
                                 "--decode", self.decode.url, "--health-interval-s", "0.5"], "router")

    @staticmethod
    def name_of(spec, disaggregated):
        return f"disagg {spec}" if disaggregated else f"colocated {spec}"

    def start(self, command, name):
        process = Process(command, name=f"slimkv-{name}").__enter__()
        self.processes.append(process)
        return process

    @property
    def url(self):
        return self.front.url

    def show_failure(self, errors):
        """What a failed run needs to be understood: its first error and the end of each process's log."""
        print(f"    first error: {errors[0][:300] if errors else '?'}", flush=True)
        for process in self.processes:
            print(f"    --- {process.name}, last lines:\n" + "\n".join(process.output().splitlines()[-8:]), flush=True)

    def close(self):
        for process in reversed(self.processes):
            process.__exit__(None, None, None)

    def router_counters(self):
        """The router's KV counters: bytes the prefill workers reported sending, and the transfers' count and
        seconds (each from the prefill worker's first piece to the decode worker's answer)."""
        status, _, text = self.front.get("/metrics")
        names = {"slimkv_router:kv_transfer_bytes_total": "bytes", "slimkv_router:kv_transfer_seconds_sum": "seconds",
                 "slimkv_router:kv_transfer_seconds_count": "transfers"}
        counters = dict.fromkeys(names.values(), 0.0)
        for line in text.decode().splitlines() if status == 200 else []:
            name = line.split(" ", 1)[0].split("{", 1)[0]
            if name in names:
                counters[names[name]] = float(line.rsplit(" ", 1)[1])
        return counters


    def step_counters(self):
        """The decoding server's step times (the decode worker's, or the colocated server's): decode steps by
        their number of sequences {n: (seconds, count)}, and the scheduler's time between steps (seconds, count)."""
        server = self.decode if self.disaggregated else self.front
        status, _, text = server.get("/metrics")
        by_sequences, between = {}, [0.0, 0.0]
        for line in text.decode().splitlines() if status == 200 else []:
            if line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)[0], float(line.rsplit(" ", 1)[1])
            base = name.split("{", 1)[0]
            if base in ("slimkv:decode_step_seconds_sum", "slimkv:decode_step_seconds_count"):
                n = int(name.split('sequences="', 1)[1].split('"', 1)[0])
                entry = by_sequences.setdefault(n, [0.0, 0.0])
                entry[0 if base.endswith("_sum") else 1] = value
            elif base == "slimkv:scheduler_between_steps_seconds_sum":
                between[0] = value
            elif base == "slimkv:scheduler_between_steps_seconds_count":
                between[1] = value
        return by_sequences, between


def step_times_line(before, after):
    """Mean decode step (ms) by sequences over a run, and the scheduler's mean time between steps (µs)."""
    steps = []
    for n in sorted(after[0]):
        seconds, count = (a - b for a, b in zip(after[0][n], before[0].get(n, [0.0, 0.0])))
        if count > 0:
            steps.append(f"{n}: {seconds / count * 1e3:.2f} ms ({count:.0f})")
    seconds, count = (a - b for a, b in zip(after[1], before[1]))
    between = f"{seconds / count * 1e6:.0f} us" if count > 0 else "-"
    return f"    decode steps by sequences: {', '.join(steps) or '-'}; between steps {between}"


def heldout_token_ids(server, path, max_chars):
    """The held-out text's token ids (tokenized by the server in pieces cut at line ends)."""
    with open(path, encoding="utf-8") as f:
        text = f.read(max_chars)
    ids, piece = [], ""
    for line in text.splitlines(keepends=True):
        piece += line
        if len(piece) > 32768:
            ids += tokenize(server, piece)
            piece = ""
    return ids + (tokenize(server, piece) if piece else [])


def tokenize(server, text):
    status, _, body = server.post("/tokenize", {"prompt": text, "add_special_tokens": False})
    if status != 200:
        raise RuntimeError(f"/tokenize answered {status}: {body}")
    return body["tokens"]


def workload(args, corpus, rate, seed):
    """[(arrival offset s, prompt ids, output tokens)]: the same for every deployment at one rate."""
    rng = random.Random(seed)

    def length(mean):
        return max(1, rng.randint(int(mean * (1 - args.range_ratio)), int(mean * (1 + args.range_ratio))))
    requests, t = [], 0.0
    for _ in range(args.num_requests):
        t += rng.expovariate(rate)
        n = length(args.input_len)
        start = rng.randrange(0, len(corpus) - n)
        requests.append((t, corpus[start:start + n], length(args.output_len)))
    return requests


def drive(deployment, model, requests, args):
    """Sends the requests at their arrival times (stopping new ones after --max-send-s); returns a result
    per request sent: {arrival, prompt, output, ttft, jct, tpot, ok, error}."""
    results = [None] * len(requests)

    def one(i, sent_at):
        ok, error, arrivals, tokens = run_request(deployment.url, model, requests[i][1], requests[i][2], args.timeout_s)
        results[i] = {"arrival": sent_at, "prompt": len(requests[i][1]), "output": requests[i][2], "ok": ok and bool(arrivals),
                      "error": error, "tokens": tokens, "ttft": arrivals[0] if arrivals else None,
                      "jct": arrivals[-1] if arrivals else None,
                      "tpot": (arrivals[-1] - arrivals[0]) / (tokens - 1) if arrivals and tokens > 1 else None,
                      # The median gap between tokens: a running sequence's step time, without the wait a
                      # disaggregated request can have between the prefill worker's first token and its
                      # admission by the decode worker (which TPOT includes).
                      "itl_p50": statistics.median(b - a for a, b in zip(arrivals, arrivals[1:])) if len(arrivals) > 1 else None}
    threads, start = [], time.perf_counter()
    for i, (offset, _, _) in enumerate(requests):
        if offset > args.max_send_s:
            break
        time.sleep(max(0.0, start + offset - time.perf_counter()))
        thread = threading.Thread(target=one, args=(i, time.perf_counter() - start))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None]


def summarize(results):
    ok = [r for r in results if r["ok"]]

    def mean(key):
        values = [r[key] for r in ok if r[key] is not None]
        return statistics.fmean(values) if values else float("nan")

    def p99(key):
        values = sorted(r[key] for r in ok if r[key] is not None)
        return values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")
    # Request throughput: completed requests over the time the rounds took, each round from its first
    # arrival to its last answer (arrival times restart at 0 each round).
    span = sum(max((r["arrival"] + r["jct"] for r in ok if r.get("round", 0) == k), default=0.0)
               for k in {r.get("round", 0) for r in ok})
    return {"sent": len(results), "completed": len(ok), "errors": sorted({r["error"] for r in results if not r["ok"]})[:3],
            "jct_mean_s": mean("jct"), "jct_p99_s": p99("jct"), "ttft_mean_s": mean("ttft"), "ttft_p99_s": p99("ttft"),
            "tpot_mean_s": mean("tpot"), "itl_p50_s": statistics.median(r["itl_p50"] for r in ok if r["itl_p50"] is not None)
            if any(r["itl_p50"] is not None for r in ok) else float("nan"), "requests_per_s": len(ok) / span if span > 0 else float("nan")}


# --- the simulator's inputs, measured (--calibrate) ---

def timed_request(server, model, prompt, max_tokens, timeout_s):
    ok, error, arrivals, tokens = run_request(server.url, model, prompt, max_tokens, timeout_s)
    if not ok:
        raise RuntimeError(f"calibration request failed: {error}")
    return arrivals, tokens


def fit(xs, ys, columns):
    """Least squares of ys on the feature columns (each a function of x), every coefficient >= 0: a
    negative one (noise on a shared machine, a term too small to see) is set to 0 and the rest refit."""
    active = list(range(len(columns)))
    while True:
        coefficients = least_squares(xs, ys, [columns[i] for i in active])
        if all(c >= 0 for c in coefficients) or len(active) == 1:
            out = [0.0] * len(columns)
            for i, c in zip(active, coefficients):
                out[i] = max(0.0, c)
            return out
        del active[min(range(len(active)), key=lambda k: coefficients[k])]


def least_squares(xs, ys, columns):
    """Least squares of ys on the given feature columns (each a function of x); returns the coefficients."""
    rows = [[c(x) for c in columns] for x in xs]
    k = len(columns)
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(k)]
    for i in range(k):  # Gaussian elimination with partial pivoting
        p = max(range(i, k), key=lambda r: abs(a[r][i]))
        a[i], a[p], b[i], b[p] = a[p], a[i], b[p], b[i]
        for r in range(i + 1, k):
            f = a[r][i] / a[i][i]
            a[r] = [x - f * y for x, y in zip(a[r], a[i])]
            b[r] -= f * b[i]
    out = [0.0] * k
    for i in reversed(range(k)):
        out[i] = (b[i] - sum(a[i][j] * out[j] for j in range(i + 1, k))) / a[i][i]
    return out


def cpu_seconds(server):
    """The server process's CPU time so far, user and system (Linux /proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{server.process.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # from field 3 on (the name may hold spaces)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calibrate(args, corpus, model, spec):
    """One worker's costs with KV spec `spec` (a codec's quantization and attention cost what they cost in
    the prefill and in every decode step), as scripts/disagg_sim.py takes them, measured on a `--role both`
    server with a worker's threads: prefill time vs prompt length (TTFT of a 1-token request alone,
    repeated), and decode step time vs batch and context (TPOT of `batch` equal requests sent together);
    and the cores the server kept busy in each phase (CPU time over wall time: its threads are not all
    busy all the time), which tell how two workers sharing this CPU slow each other (device_share)."""
    server = Process([args.slimkv, "serve", "--model", args.model, "--kv", spec, "--host", "127.0.0.1",
                      "--port", "0", "--threads", str(args.threads), "--max-model-len", str(args.max_model_len),
                      "--max-num-seqs", str(args.max_num_seqs), "--prefill-chunk-tokens", str(args.prefill_chunk_tokens)]
                     + args.serve_args.split(), name="slimkv-calibrate").__enter__()
    try:
        rng = random.Random(1)
        lengths, seconds = [], []
        longest = args.max_model_len - 1  # a prompt and its one token
        cpu, wall = cpu_seconds(server), time.perf_counter()
        for n in [min(int(args.input_len * f), longest) for f in (0.25, 0.5, 1.0, 1.5)] * args.calibration_repeats:
            start = rng.randrange(0, len(corpus) - n)
            arrivals, _ = timed_request(server, model, corpus[start:start + n], 1, args.timeout_s)
            lengths.append(n)
            seconds.append(arrivals[0])
        base, per_token, per_token2 = fit(lengths, seconds, [lambda n: 1.0, lambda n: n, lambda n: n * n])
        prefill_cores = (cpu_seconds(server) - cpu) / (time.perf_counter() - wall)
        cpu, wall = cpu_seconds(server), time.perf_counter()
        steps = []  # (batch, context tokens of the batch, step seconds)
        for batch in (1, 2, 4):
            for n in (args.input_len // 2, args.input_len):
                prompts = []
                for _ in range(batch):
                    start = rng.randrange(0, len(corpus) - n)
                    prompts.append(corpus[start:start + n])
                tpots = [None] * batch

                def one(i):
                    arrivals, tokens = timed_request(server, model, prompts[i], args.output_len, args.timeout_s)
                    # the steps after every prompt of the batch is in: the second half of the output
                    half = len(arrivals) // 2
                    tpots[i] = (arrivals[-1] - arrivals[half]) / max(1, len(arrivals) - 1 - half)
                threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                steps.append((batch, batch * (n + args.output_len * 3 // 4), statistics.median(tpots)))
        step_base, per_seq, per_context = fit(steps, [s[2] for s in steps],
                                              [lambda s: 1.0, lambda s: s[0], lambda s: s[1]])
        decode_cores = (cpu_seconds(server) - cpu) / (time.perf_counter() - wall)  # its prompts' prefills too
    finally:
        server.__exit__(None, None, None)
    return {"prefill_base_s": base, "prefill_s_per_token": per_token, "prefill_s_per_token2": per_token2,
            "step_base_s": step_base, "step_s_per_seq": per_seq, "step_s_per_context_token": per_context,
            "prefill_points": list(zip(lengths, seconds)), "step_points": steps,
            "prefill_cores": prefill_cores, "decode_cores": decode_cores}


def calibrate_host_path(args, specs, model_config):
    """Each spec's host path (seconds per transfer byte of the export, the stream without a cap and the
    import), as disagg_sim's host_path_s_per_byte takes it: --host-path-costs when given (the GPU's, from
    bench/cuda/bench_kv_transport_cuda's TCP row), else measured by bench_kv_host_path on the model's KV
    shape at --input-len tokens, its "repeated" rows (a server's transfers after its first)."""
    if args.host_path_costs:
        with open(args.host_path_costs) as f:
            return json.load(f)
    layers = model_config["num_hidden_layers"]
    heads = model_config.get("num_key_value_heads", model_config["num_attention_heads"])
    head_dim = model_config.get("head_dim") or model_config["hidden_size"] // model_config["num_attention_heads"]
    bench = args.host_path_bench or os.path.join(os.path.dirname(args.slimkv), "bench_kv_host_path")
    command = [bench, "--specs", ";".join(specs), "--prompt-tokens", str(args.input_len), "--layers", str(layers),
               "--kv-heads", str(heads), "--head-dim", str(head_dim), "--repeats", str(max(3, args.calibration_repeats))]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {out.stderr.strip()}")
    costs = {}
    for line in out.stdout.splitlines():
        fields = line.split()
        # spec tokens MB variant export-ms GB/s stream-ms GB/s import-ms GB/s total-ms GB/s x-first
        if len(fields) == 13 and fields[0] in specs and fields[3] == "repeated":
            transfer_bytes = float(fields[2]) * 1e6
            costs[fields[0]] = {stage: float(fields[i]) / 1e3 / transfer_bytes
                                for stage, i in (("export", 4), ("stream", 6), ("import", 8))}
    missing = [spec for spec in specs if spec not in costs]
    if missing:
        raise RuntimeError(f"{bench} printed no 'repeated' row for {missing}:\n{out.stdout}")
    return costs


def on_gpu(args):
    return "--device cuda" in " ".join(args.serve_args.split())


def device_share(args, costs):
    """disagg_sim's device_share for the two workers of one machine: while both run, each one's share of its
    speed alone. One GPU time-slices the contexts of two processes: 1/2. On the CPU the scheduler shares
    the cores among the threads that want them: the cores over those that a prefilling and a decoding
    worker keep busy, as calibrated alone (`costs`), at most 1."""
    if on_gpu(args):
        return 0.5
    return min(1.0, os.cpu_count() / (costs["prefill_cores"] + costs["decode_cores"]))


def simulate(costs, results, bytes_per_token, args, num_layers, shared=True):
    """disagg_sim's prediction for one measured deployment: each round's arrivals and lengths as measured,
    one prefill and one decode worker with the deployment's spec's `costs`, each stream paced at the cap
    and the host path as calibrated (none: free); the rounds' requests pooled. The prefill worker, CPU or
    GPU, sends each layer's KV as its step computes it (overlap_layers). Both workers share one
    device (one GPU, or this CPU's cores) unless --two-gpus (`shared` false: as if they did not)."""
    config = {key: costs[key] for key in ("prefill_base_s", "prefill_s_per_token", "prefill_s_per_token2",
                                          "step_base_s", "step_s_per_seq", "step_s_per_context_token")}
    config.update({"shared_devices": [[0, 0]] if shared and not args.two_gpus else [], "device_share": device_share(args, costs)})
    # A GPU's host path is copies and host threads, off the kernels' time-slicing; on its TCP path the hosts'
    # work and the pacing add up (disagg_sim's stream_then_pace, docs/disaggregated.md).
    config.update({"host_path_on_device": not on_gpu(args), "stream_then_pace": on_gpu(args)})
    config.update({"prefill_workers": 1, "decode_workers": 1, "link_gbps": args.kv_bandwidth_gbps,
                   "num_layers": num_layers, "max_batch": args.max_num_seqs, "overlap_layers": True,
                   "link_shared": False,  # --kv-bandwidth-gbps paces each stream on its own,
                   "link_burst_bytes": 4 << 20,  # with a token bucket of 4 MiB (TokenBucket's burst_bytes)
                   "prefill_chunk_tokens": args.prefill_chunk_tokens, "overlap_chunks": args.chunk_overlap,
                   "kv_bytes_per_token": {"measured": bytes_per_token},
                   "host_path_s_per_byte": {"measured": costs["host_path_s_per_byte"]} if costs["host_path_s_per_byte"] else {}})
    pooled = []
    for round_index in sorted({r["round"] for r in results}):
        config["requests"] = [[r["arrival"], r["prompt"], r["output"]] for r in results if r["round"] == round_index]
        pooled += disagg_sim.simulate(disagg_sim.Config(config), "measured")
    return disagg_sim.summarize(pooled)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slimkv", default="build/release/slimkv")
    parser.add_argument("--model", default="models/slimkv-llama-15m")
    parser.add_argument("--text", default=None, help="prompt text (default: the model's heldout.txt)")
    parser.add_argument("--specs", default="dense:dtype=f16;hack:bits=2,pi=64;hack:bits=4",
                        help="';'-separated KV specs of the disaggregated deployments; the first is the ratios' base")
    parser.add_argument("--colocated-spec", default="dense:dtype=f16")
    parser.add_argument("--kv-bandwidth-gbps", type=float, default=1.0)
    parser.add_argument("--serve-args", default="", help="more options for every server, e.g. '--device cuda'")
    parser.add_argument("--two-gpus", action="store_true",
                        help="the decode workers on the second GPU (the KV then goes by NCCL where it can)")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="start each deployment only for its runs (one GPU cannot hold five 8B processes at once)")
    parser.add_argument("--rates", default="0.5,1,2", help="arrival rates, requests/s")
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--max-send-s", type=float, default=120, help="no arrivals after this")
    parser.add_argument("--input-len", type=int, default=2048)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--range-ratio", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1, help="per worker (the colocated server: twice this)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--prefill-chunk-tokens", type=int, default=512, help="every server's")
    parser.add_argument("--chunk-overlap", action=argparse.BooleanOptionalAction, default=True,
                        help="the simulator's model of the prefill worker: every prompt chunk's KV streams as computed "
                             "(--no-chunk-overlap: only the last chunk's step overlaps, as slimkv before issue 23's step 3)")
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="repeats of each rate's workload, deployments rotated")
    parser.add_argument("--calibrate", action="store_true", help="measure the simulator's costs and compare")
    parser.add_argument("--calibration-repeats", type=int, default=3)
    parser.add_argument("--host-path-bench", default=None,
                        help="--calibrate: the bench_kv_host_path binary that measures the host path (default: beside --slimkv)")
    parser.add_argument("--host-path-costs", default=None,
                        help="--calibrate: a JSON file {spec: {export, stream, import: seconds per byte}} to use instead "
                             "(a GPU's host path: bench_kv_transport_cuda's TCP row)")
    parser.add_argument("--json", help="write every run's results here")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    specs = [s for s in args.specs.split(";") if s]
    text = args.text or os.path.join(args.model, "heldout.txt")
    with open(os.path.join(args.model, "config.json")) as f:
        model_config = json.load(f)
    num_layers = model_config["num_hidden_layers"]

    plans = [(args.colocated_spec, False)] + [(spec, True) for spec in specs]
    names = [Deployment.name_of(*plan) for plan in plans]
    live = {}  # plan index -> its running Deployment

    def deployment_of(i):
        if i not in live:
            live[i] = Deployment(args, *plans[i])
        return live[i]

    try:
        if not args.one_at_a_time:
            for i in range(len(plans)):
                deployment_of(i)
        front = deployment_of(0).front
        model = front.get("/v1/models")[2]["data"][0]["id"]
        corpus = heldout_token_ids(front, text, max_chars=400_000)
        print(f"{len(corpus)} held-out tokens from {text}; {args.num_requests} requests a run, prompts "
              f"{args.input_len}±{args.range_ratio:.0%}, outputs {args.output_len}±{args.range_ratio:.0%}, "
              f"KV link cap {args.kv_bandwidth_gbps} Gbit/s, {args.threads} thread(s) a worker", flush=True)
        # Each rate's workload runs --rounds times through every deployment, the order rotated each
        # round, so that a load that drifts on a shared machine falls on every deployment alike.
        runs = {(rate, names[i]): {"rate": rate, "deployment": names[i], "spec": spec, "disaggregated": disaggregated,
                                   "requests": [], "kv_bytes": 0.0, "kv_transfer_seconds": 0.0, "kv_transfers": 0.0}
                for rate in rates for i, (spec, disaggregated) in enumerate(plans)}
        for rate in rates:
            requests = workload(args, corpus, rate, seed=args.seed + int(rate * 1000))
            for round_index in range(args.rounds):
                shift = round_index % len(plans)
                order = list(range(len(plans)))
                for i in order[shift:] + order[:shift]:
                    deployment = deployment_of(i)
                    run = runs[(rate, deployment.name)]
                    kv_before = deployment.router_counters() if deployment.disaggregated else None
                    steps_before = deployment.step_counters()
                    results = drive(deployment, model, requests, args)
                    for r in results:
                        r["round"] = round_index
                    run["requests"] += results
                    transfer = ""
                    if deployment.disaggregated:
                        kv_after = deployment.router_counters()
                        run["kv_bytes"] += kv_after["bytes"] - kv_before["bytes"]
                        run["kv_transfer_seconds"] += kv_after["seconds"] - kv_before["seconds"]
                        run["kv_transfers"] += kv_after["transfers"] - kv_before["transfers"]
                        transfer = f", KV transfer {run['kv_transfer_seconds'] / max(1, run['kv_transfers']):.3f} s"
                    s = summarize(results)
                    print(f"  rate {rate} round {round_index}: {deployment.name}: {s['completed']}/{s['sent']} done, "
                          f"JCT {s['jct_mean_s']:.3f} s, TTFT {s['ttft_mean_s']:.3f} s, TPOT {s['tpot_mean_s'] * 1e3:.1f} ms"
                          f"{transfer}", flush=True)
                    print(step_times_line(steps_before, deployment.step_counters()), flush=True)
                    if s["completed"] < s["sent"]:
                        deployment.show_failure(s["errors"])
                    if args.one_at_a_time:
                        live.pop(i).close()
        runs = list(runs.values())
        for run in runs:
            run["summary"] = summarize(run["requests"])
            transfers = run.pop("kv_transfers")
            transfer_seconds = run.pop("kv_transfer_seconds")
            if run["disaggregated"]:
                run["kv_bytes_per_token"] = run.pop("kv_bytes") / max(1, sum(r["prompt"] for r in run["requests"] if r["ok"]))
                run["kv_transfer_mean_s"] = transfer_seconds / max(1, transfers)
            else:
                run.pop("kv_bytes")
    finally:
        for deployment in live.values():
            deployment.close()

    base_name = names[1] if len(names) > 1 else names[0]
    for rate in rates:
        of_rate = [r for r in runs if r["rate"] == rate]
        base = next(r for r in of_rate if r["deployment"] == base_name)["summary"]
        print(f"\narrival rate {rate} req/s (ratios: to {base_name})")
        print(f"{'deployment':<34}{'done':>7}{'JCT mean s':>12}{'JCT p99 s':>11}{'TTFT mean s':>13}{'TTFT p99 s':>12}"
              f"{'TPOT ms':>9}{'ITL p50':>9}{'req/s':>8}{'KV B/tok':>10}{'JCT x':>8}{'TTFT x':>8}{'req/s x':>9}")
        for run in of_rate:
            s = run["summary"]
            print(f"{run['deployment']:<34}{s['completed']:>3}/{s['sent']:<3}{s['jct_mean_s']:>12.3f}{s['jct_p99_s']:>11.3f}"
                  f"{s['ttft_mean_s']:>13.3f}{s['ttft_p99_s']:>12.3f}{s['tpot_mean_s'] * 1e3:>9.1f}{s['itl_p50_s'] * 1e3:>9.2f}{s['requests_per_s']:>8.3f}"
                  f"{run.get('kv_bytes_per_token', float('nan')):>10.1f}{s['jct_mean_s'] / base['jct_mean_s']:>8.3f}"
                  f"{s['ttft_mean_s'] / base['ttft_mean_s']:>8.3f}{s['requests_per_s'] / base['requests_per_s']:>9.3f}")
            for error in s["errors"]:
                print(f"    error: {error[:200]}")

    costs = None  # spec -> its costs and host path
    if args.calibrate:
        host_paths = calibrate_host_path(args, specs, model_config)
        costs = {spec: dict(calibrate(args, corpus, model, spec), host_path_s_per_byte=host_paths.get(spec)) for spec in specs}
        print(f"\nmeasured costs (one worker, {args.threads} thread(s)):")
        for spec, c in costs.items():
            path = c["host_path_s_per_byte"]
            print(f"  {spec}: prefill {c['prefill_base_s'] * 1e3:.2f} ms + {c['prefill_s_per_token'] * 1e6:.2f} us/token + "
                  f"{c['prefill_s_per_token2'] * 1e9:.4f} ns/token^2; decode step {c['step_base_s'] * 1e3:.2f} ms + "
                  f"{c['step_s_per_seq'] * 1e3:.3f} ms/seq + {c['step_s_per_context_token'] * 1e9:.1f} ns/context token; "
                  f"cores busy {c['prefill_cores']:.2f} prefilling, {c['decode_cores']:.2f} decoding; host path "
                  + (f"export {1e-9 / path['export']:.2f} GB/s, stream {1e-9 / path['stream']:.2f} GB/s, import "
                     f"{1e-9 / path['import']:.2f} GB/s" if path and all(path.values()) else f"{path}"))
        print("simulator: the two workers on " + ("two GPUs" if args.two_gpus else "one device, each at " + ", ".join(
            f"{device_share(args, c):.2f} ({spec})" for spec, c in costs.items()) + " of its speed alone while both run"))
        print("simulator (scripts/disagg_sim.py, the same arrivals and lengths) vs measured, disaggregated runs:")
        print(f"{'rate':>5}  {'spec':<22}{'JCT meas':>10}{'JCT sim':>9}{'err':>8}{'TTFT meas':>11}{'TTFT sim':>10}{'err':>8}"
              f"{'TPOT meas':>11}{'TPOT sim':>10}{'JCT sim, workers apart':>23}{'err':>8}")
        for run in runs:
            if not run["disaggregated"]:
                continue
            done = [r for r in run["requests"] if r["ok"]]
            predicted = simulate(costs[run["spec"]], done, run["kv_bytes_per_token"], args, num_layers)
            apart = simulate(costs[run["spec"]], done, run["kv_bytes_per_token"], args, num_layers, shared=False)
            run["simulated"], run["simulated_workers_apart"] = predicted, apart
            s = run["summary"]
            jct, ttft, tpot = (predicted[k]["mean"] for k in ("jct_s", "ttft_s", "tpot_s"))
            jct_apart = apart["jct_s"]["mean"]
            print(f"{run['rate']:>5}  {run['spec']:<22}{s['jct_mean_s']:>10.3f}{jct:>9.3f}{jct / s['jct_mean_s'] - 1:>+8.1%}"
                  f"{s['ttft_mean_s']:>11.3f}{ttft:>10.3f}{ttft / s['ttft_mean_s'] - 1:>+8.1%}"
                  f"{s['tpot_mean_s'] * 1e3:>11.1f}{tpot * 1e3:>10.1f}{jct_apart:>23.3f}{jct_apart / s['jct_mean_s'] - 1:>+8.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "costs": costs, "runs": runs}, f, indent=1)
    return 1 if any(r["summary"]["completed"] < r["summary"]["sent"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
