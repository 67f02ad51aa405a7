#!/usr/bin/env python3
"""`slimkv serve --device cuda` with the pq selector (issue 25): requests of different lengths (16 to
391 prompt tokens) decode together — prompts, whole or cut to the step's token budget, beside the
others' decode rows in one step — and each greedy output equals the same prompt run alone by `slimkv
generate --device cuda`. With `pq:...@offload` (with and without a GPU cache of selected tokens), and
resident `pq:...` under a KV budget small enough that the scheduler preempts requests (their KV
exported to host memory, then imported with the PQ index rebuilt): outputs unchanged, no request lost.

Usage: pq_cuda_serve_test.py SLIMKV_BINARY SOURCE_DIR [SERVE_ARGS...]  (needs a GPU; SERVE_ARGS go to
every server and generate run, e.g. `--device cuda:1`; the default is `--device cuda`)."""
import os
import subprocess
import sys
import threading

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slimkv_server import Server  # noqa: E402

SLIMKV, SOURCE, EXTRA = sys.argv[1], sys.argv[2], sys.argv[3:]
if "--device" not in EXTRA:
    EXTRA = ["--device", "cuda"] + EXTRA
MODEL = os.path.join(SOURCE, "models", "slimkv-llama-15m")
# Segments of 64 tokens and 16 centroids: the longer prompts have codebooks before their first decode
# step and select a quarter of the middle tokens.
PQ = "pq:m=2,b=4,topk=0.25,local=16,init=4,segment=64"
SENTENCE = "Once upon a time there was a small village by the sea, and every morning the fishermen went out. "
PROMPTS = [
    "The history of the river begins in the mountains, where",
    SENTENCE * 3,
    "In mathematics, a prime number is " + SENTENCE * 6,
    SENTENCE * 12 + "The old fisherman said",
    "Scientists have discovered " + SENTENCE * 9,
]
MAX_TOKENS = 40
# A block is 64 tokens of every layer and KV head in FP16: 8 layers · 2 heads · K and V · 64 · 128 · 2 B.
BLOCK_BYTES = 8 * 2 * 2 * 64 * 128 * 2


def generate_alone(spec, prompt):
    """The greedy continuation of `prompt` by `slimkv generate` (which prints it and a newline)."""
    out = subprocess.run([SLIMKV, "generate", "--model", MODEL, "--kv", spec, "--prompt", prompt, "--max-tokens",
                          str(MAX_TOKENS), "--temperature", "0"] + EXTRA, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"slimkv generate --kv {spec} failed:\n{out.stderr}")
    assert out.stdout.endswith("\n"), out.stdout
    return out.stdout[:-1]


def completion(server, prompt):
    status, _, answer = server.post("/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    return answer["choices"][0]["text"] if status == 200 else f"<{status} {answer}>"


def check(spec, args, failures, want_preemptions):
    """Every prompt sent at once to one server, each answer against `slimkv generate` alone."""
    alone = [generate_alone(spec, p) for p in PROMPTS]
    together = [None] * len(PROMPTS)
    with Server(SLIMKV, MODEL, ["--kv", spec, "--max-num-seqs", "8"] + args + EXTRA) as server:
        threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, completion(server, PROMPTS[i])))
                   for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = {name: server.metric("slimkv:" + name)
                   for name in ["num_preemptions_total", "num_preemptions_recomputed_total"]}
        print(f"--kv {spec} {' '.join(args)}: {metrics}")
        for i, (a, t) in enumerate(zip(alone, together)):
            if a != t:
                # The same prompt alone on this server tells a batch's effect from the server's own.
                failures.append(f"--kv {spec} {args}: prompt {i}: served together {t!r} != generated alone {a!r} "
                                f"(served alone: {completion(server, PROMPTS[i])!r})")
    if want_preemptions and metrics["num_preemptions_total"] == 0:
        failures.append(f"--kv {spec} {args}: no request was preempted ({metrics})")
    if metrics["num_preemptions_recomputed_total"] > 0:  # host memory holds them all: each went there
        failures.append(f"--kv {spec} {args}: preempted requests were recomputed, not moved to host memory ({metrics})")


def main():
    failures = []
    check(PQ + "@offload", [], failures, want_preemptions=False)
    check(PQ + ",cache=24,policy=lfu@offload", [], failures, want_preemptions=False)
    # 10 blocks: the longest request needs 7 (391 prompt tokens and 40 more), the five together 21.
    check(PQ, ["--kv-cache-bytes", str(10 * BLOCK_BYTES)], failures, want_preemptions=True)
    for failure in failures:
        print("FAIL:", failure)
    if failures:
        # The same requests with dense KV tell a batch's arithmetic on the GPU (its GEMMs, attention splits,
        # prompts cut to the step's budget) from pq's selection: not counted, printed beside.
        control = []
        check("dense", [], control, want_preemptions=False)
        print("dense, the same requests:", "equal" if not control else "; ".join(control))
    print("pq on cuda served: ok" if not failures else f"pq on cuda served: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
