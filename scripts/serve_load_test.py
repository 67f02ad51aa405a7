#!/usr/bin/env python3
"""A bounded load test of slimkv serve on loopback: N requests from C concurrent clients (completions
and chat-free prompts of mixed lengths, streamed and whole, some clients leaving mid-stream), then
checks: no request failed, no sequence leaked (num_requests_running and KV usage back to 0), and the
server's memory did not keep growing. The requests run in two halves, each followed by the server idling
until it has given its free heap back (a second, engine/scheduler.cc): its RSS then is what it holds, so
the RSS after the second half must be within 10% + 16 MiB of that after the first. (Without the idle,
RSS is the high-water mark of the busiest moment so far, which climbs for hundreds of requests as longer
sequences happen to meet: growth, but no leak.)

  scripts/serve_load_test.py --slimkv build/release/slimkv --requests 1000 --concurrency 64
ctest runs a short version (tests/serve: --requests 64 --concurrency 16)."""
import argparse
import json
import os
import random
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve"))
from slimkv_server import Server, stream_text  # noqa: E402


def status_bytes(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes(pid):
    return status_bytes(pid, "VmRSS")


def peak_rss_bytes(pid):
    return status_bytes(pid, "VmHWM")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slimkv", required=True)
    parser.add_argument("--model", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models",
                                                        "slimkv-llama-15m"))
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=48, help="outputs are 1..this")
    parser.add_argument("--server-args", default="--max-num-seqs 16", help="extra slimkv serve flags")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-memory-check", action="store_true",
                        help="skip the RSS growth check (an ASan build holds freed memory in quarantine, so its RSS "
                             "grows without a leak; LeakSanitizer checks the server at exit instead)")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    words = "the of a river city story time number light sound water people small great old new world".split()
    jobs = []
    for i in range(args.requests):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 300)))
        jobs.append({"prompt": prompt, "max_tokens": rng.randint(1, args.max_tokens), "temperature": rng.choice([0, 0.8]),
                     "seed": i, "stream": i % 2 == 0, "leave": i % 10 == 3, "index": i})

    failures, lock = [], threading.Lock()
    finished = {"stop": 0, "length": 0, "left": 0}

    with Server(args.slimkv, args.model, args.server_args.split()) as server:
        def client(queue):
            while True:
                with lock:
                    if not queue:
                        return
                    job = queue.pop(0)
                body = {k: job[k] for k in ("prompt", "max_tokens", "temperature", "seed")}
                try:
                    if job["leave"]:
                        # Reads two events of a long stream, then hangs up.
                        connection = server.connection()
                        connection.request("POST", "/v1/completions", json.dumps(dict(body, max_tokens=400, ignore_eos=True, stream=True)),
                                           {"Content-Type": "application/json"})
                        response = connection.getresponse()
                        events = 0
                        for line in response:
                            events += line.startswith(b"data: ")
                            if events == 2:
                                break
                        connection.close()
                        with lock:
                            finished["left"] += 1
                        continue
                    if job["stream"]:
                        status, events = server.stream("/v1/completions", dict(body, stream=True))
                        ok = status == 200 and events[-1] == "[DONE]"
                        finish = stream_text(events)[1] if ok else None
                    else:
                        status, _, response = server.post("/v1/completions", body)
                        ok = status == 200
                        finish = response["choices"][0]["finish_reason"] if ok else None
                    if not ok or finish not in ("stop", "length"):
                        raise RuntimeError(f"status {status}, finish {finish}")
                    with lock:
                        finished[finish] += 1
                except Exception as e:  # every failure is reported, none stops the run
                    with lock:
                        failures.append(f"request {job['index']}: {e!r}")

        def run_then_idle(queue):
            """Runs the jobs from `concurrency` clients, waits (30 s at most) until the server has no
            request left, then long enough idle that it gave its free heap back; the server's RSS then."""
            threads = [threading.Thread(target=client, args=(queue,)) for _ in range(args.concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            deadline = time.time() + 30
            while (server.metric("slimkv:num_requests_running") or server.metric("slimkv:num_requests_waiting")) \
                    and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(2.0)
            return rss_bytes(server.process.pid)

        half = len(jobs) // 2
        start = time.time()
        rss_half = run_then_idle(jobs[:half])
        rss_end = run_then_idle(jobs[half:])
        duration = time.time() - start - 2 * 2.0
        running = server.metric("slimkv:num_requests_running")
        waiting = server.metric("slimkv:num_requests_waiting")
        kv_usage = server.metric("slimkv:kv_cache_usage_perc")
        rss_peak = peak_rss_bytes(server.process.pid)
        exit_code = server.stop()

    print(f"{args.requests} requests, {args.concurrency} concurrent, {duration:.1f} s "
          f"({args.requests / duration:.1f} req/s): finished {finished}, {len(failures)} failures")
    print(f"after: running {running:g}, waiting {waiting:g}, KV usage {kv_usage:g}; "
          f"server RSS idle {rss_half / 2**20:.1f} MiB at half, {rss_end / 2**20:.1f} MiB at the end "
          f"(peak {rss_peak / 2**20:.1f} MiB); exit code {exit_code}")
    for failure in failures[:10]:
        print("FAIL:", failure)
    problems = []
    if failures:
        problems.append(f"{len(failures)} requests failed")
    if running or waiting or kv_usage:
        problems.append("a sequence leaked")
    if not args.no_memory_check and rss_end > rss_half * 1.10 + (16 << 20):
        problems.append("server memory kept growing")
    if exit_code != 0:
        problems.append(f"exit code {exit_code} after SIGTERM")
    print("PASS" if not problems else "FAIL: " + "; ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
