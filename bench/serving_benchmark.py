#!/usr/bin/env python3
"""Serving benchmark for slimkv serve (or any OpenAI-compatible /v1/completions server), in the manner
of vLLM's benchmark_serving: requests arrive as a Poisson process at --request-rate, prompts of random
token ids with lengths drawn uniformly around --input-len, outputs of lengths around --output-len
(ignore_eos, so each request generates exactly its length), every request streamed so that each token's
arrival is timed. Prints TTFT, TPOT, ITL and end-to-end percentiles, request and token throughput, and
(from the server's /metrics, read every half second) the most requests it ran at once, the mean number
running (the concurrency it sustained) and its peak KV usage; --json writes them. Python 3 standard
library only (http.client + threads).

  bench/serving_benchmark.py --url http://127.0.0.1:8000 --num-prompts 64 --request-rate 4 \
      --input-len 1024 --output-len 64
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def run_request(url, model, prompt, max_tokens, timeout_s):
    """Streams one completion; returns (ok, error, token arrival times relative to the send, tokens)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    arrivals, completion_tokens = [], 0
    try:
        connection.request("POST", parts.path.rstrip("/") + "/v1/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            return False, f"HTTP {response.status}: {response.read()[:200]!r}", [], 0
        for line in response:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if event.get("choices"):
                # One timestamp per chunk with text: each chunk is one token or more (a token whose text
                # completes later arrives with the next one, as in vLLM's ITL).
                if event["choices"][0].get("text"):
                    arrivals.append(time.perf_counter() - start)
            if event.get("usage"):
                completion_tokens = event["usage"]["completion_tokens"]
            if "error" in event:
                return False, str(event["error"]), arrivals, completion_tokens
        return True, "", arrivals, completion_tokens
    except (OSError, http.client.HTTPException) as e:
        return False, repr(e), arrivals, completion_tokens
    finally:
        connection.close()


def sample_metrics(url, names, samples, stop):
    """Until `stop` is set, reads the server's Prometheus /metrics twice a second and appends each gauge's
    value to `samples[name]` (a server without them leaves `samples` empty)."""
    parts = urllib.parse.urlsplit(url)
    while not stop.wait(0.5):
        try:
            connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=5)
            connection.request("GET", "/metrics")
            text = connection.getresponse().read().decode()
            connection.close()
        except (OSError, http.client.HTTPException):
            continue
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            name = series.partition("{")[0]  # the name without its labels
            if name in names:
                samples.setdefault(name, []).append(float(value))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--range-ratio", type=float, default=0.5,
                        help="lengths uniform in [len*(1-r), len*(1+r)]")
    parser.add_argument("--vocab-low", type=int, default=10, help="prompt ids are drawn from [low, high)")
    parser.add_argument("--vocab-high", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--label", default="", help="a name for this run in the output")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    parts = urllib.parse.urlsplit(args.url)
    if args.model is None:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
        connection.request("GET", "/v1/models")
        args.model = json.loads(connection.getresponse().read())["data"][0]["id"]

    rng = random.Random(args.seed)

    def length(mean):
        return max(1, rng.randint(int(mean * (1 - args.range_ratio)), int(mean * (1 + args.range_ratio))))
    requests = []
    for _ in range(args.num_prompts):
        prompt = [rng.randrange(args.vocab_low, args.vocab_high) for _ in range(length(args.input_len))]
        requests.append((prompt, length(args.output_len)))
    gaps = [0.0 if args.request_rate == float("inf") else rng.expovariate(args.request_rate) for _ in requests]

    results = [None] * len(requests)

    def worker(i):
        results[i] = run_request(args.url, args.model, requests[i][0], requests[i][1], args.timeout_s)
        results[i] = results[i] + (time.perf_counter(),)

    samples, stop_sampling = {}, threading.Event()
    gauges = ("slimkv:num_requests_running", "slimkv:kv_cache_usage_perc")
    sampler = threading.Thread(target=sample_metrics, args=(args.url, gauges, samples, stop_sampling))
    sampler.start()
    threads = []
    start = time.perf_counter()
    for i, gap in enumerate(gaps):
        time.sleep(gap)  # Poisson arrivals: exponential gaps
        sends = time.perf_counter()
        thread = threading.Thread(target=worker, args=(i,))
        thread.start()
        threads.append((thread, sends))
    for thread, _ in threads:
        thread.join()
    duration = time.perf_counter() - start
    stop_sampling.set()
    sampler.join()

    ttft, tpot, itl, e2e, errors = [], [], [], [], []
    output_tokens = input_tokens = 0
    for i, (ok, error, arrivals, tokens, end) in enumerate(results):
        if not ok or not arrivals:
            errors.append(error or "no tokens")
            continue
        input_tokens += len(requests[i][0])
        output_tokens += tokens
        ttft.append(arrivals[0])
        e2e.append(arrivals[-1])
        itl += [b - a for a, b in zip(arrivals, arrivals[1:])]
        if tokens > 1:
            tpot.append((arrivals[-1] - arrivals[0]) / (tokens - 1))
    completed = len(ttft)
    summary = {
        "label": args.label, "model": args.model, "url": args.url, "num_prompts": args.num_prompts,
        "request_rate": args.request_rate, "input_len": args.input_len, "output_len": args.output_len,
        "range_ratio": args.range_ratio, "completed": completed, "errors": len(errors), "duration_s": duration,
        "request_throughput": completed / duration, "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "max_running": max(samples.get(gauges[0], [float("nan")])),
        "mean_running": statistics.fmean(samples.get(gauges[0], [float("nan")])),
        "max_kv_usage": max(samples.get(gauges[1], [float("nan")])),
    }
    for name, values in [("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2el_ms", e2e)]:
        ms = [v * 1000 for v in values]
        summary[f"mean_{name}"] = statistics.fmean(ms) if ms else float("nan")
        for q in (50, 90, 99):
            summary[f"p{q}_{name}"] = percentile(ms, q)

    print(f"============ Serving Benchmark Result {args.label} ============")
    print(f"{'Successful requests:':<40}{completed:>12}")
    print(f"{'Failed requests:':<40}{len(errors):>12}")
    print(f"{'Benchmark duration (s):':<40}{duration:>12.2f}")
    print(f"{'Total input tokens:':<40}{input_tokens:>12}")
    print(f"{'Total generated tokens:':<40}{output_tokens:>12}")
    print(f"{'Request throughput (req/s):':<40}{summary['request_throughput']:>12.2f}")
    print(f"{'Output token throughput (tok/s):':<40}{summary['output_throughput']:>12.2f}")
    print(f"{'Total token throughput (tok/s):':<40}{summary['total_token_throughput']:>12.2f}")
    print(f"{'Most requests running at once:':<40}{summary['max_running']:>12.0f}")
    print(f"{'Mean requests running:':<40}{summary['mean_running']:>12.2f}")
    print(f"{'Peak KV cache usage:':<40}{summary['max_kv_usage']:>12.2f}")
    for title, name in [("Time to First Token", "ttft_ms"), ("Time per Output Token (excl. 1st token)", "tpot_ms"),
                        ("Inter-token Latency", "itl_ms"), ("End-to-end Latency", "e2el_ms")]:
        print(f"{'-' * 15}{title}{'-' * 15}")
        for stat in ("mean", "p50", "p90", "p99"):
            print(f"{stat.capitalize() + ' ' + name.split('_')[0].upper() + ' (ms):':<40}{summary[f'{stat}_{name}']:>12.2f}")
    for error in errors[:5]:
        print("error:", error, file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
