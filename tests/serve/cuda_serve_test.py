#!/usr/bin/env python3
"""`slimkv serve --device cuda` serves each request the bits it gets alone (issues 22 and 25): requests of
different lengths (16 to 391 prompt tokens) decode together — prompts, whole or cut to the step's token
budget, beside the others' decode rows in one step — and each greedy output equals the same prompt run
alone by `slimkv generate --device cuda`. For each kind of GPU KV: dense, hack at 2 bits, quant, ZACK alone
and followed by hack; pq with `@offload` (with and without a GPU cache of selected tokens), and resident
`pq:...` under a KV budget small enough that the scheduler preempts requests (their KV exported to host
memory, then imported with the PQ index rebuilt): outputs unchanged, no request lost.

Usage: cuda_serve_test.py SLIMKV_BINARY SOURCE_DIR [SERVE_ARGS...]  (needs a GPU; SERVE_ARGS go to
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


def generate_alone(spec, prompt, max_tokens):
    """The greedy continuation of `prompt` by `slimkv generate` (which prints it and a newline)."""
    out = subprocess.run([SLIMKV, "generate", "--model", MODEL, "--kv", spec, "--prompt", prompt, "--max-tokens",
                          str(max_tokens), "--temperature", "0"] + EXTRA, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"slimkv generate --kv {spec} failed:\n{out.stderr}")
    assert out.stdout.endswith("\n"), out.stdout
    return out.stdout[:-1]


def completion(server, prompt, max_tokens):
    status, _, answer = server.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    return answer["choices"][0]["text"] if status == 200 else f"<{status} {answer}>"


def check(spec, args, failures, want_preemptions, max_tokens=MAX_TOKENS):
    """Every prompt sent at once to one server, each answer against `slimkv generate` alone."""
    alone = [generate_alone(spec, p, max_tokens) for p in PROMPTS]
    together = [None] * len(PROMPTS)
    with Server(SLIMKV, MODEL, ["--kv", spec, "--max-num-seqs", "8"] + args + EXTRA) as server:
        threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, completion(server, PROMPTS[i], max_tokens)))
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
                                f"(served alone: {completion(server, PROMPTS[i], max_tokens)!r})")
    if want_preemptions and metrics["num_preemptions_total"] == 0:
        failures.append(f"--kv {spec} {args}: no request was preempted ({metrics})")
    if metrics["num_preemptions_recomputed_total"] > 0:  # host memory holds them all: each went there
        failures.append(f"--kv {spec} {args}: preempted requests were recomputed, not moved to host memory ({metrics})")


def main():
    failures = []
    # Each KV kind's arithmetic beside other sequences: the GEMMs per sequence, the attention's splits by
    # the sequence alone, a codec's prompt chunks cut where `generate` cuts them.
    for spec in ("dense", "hack:bits=2,pi=64", "quant:bits=4", "zack:rate=0.5", "zack:rate=0.5,align=4+hack:bits=4"):
        check(spec, [], failures, want_preemptions=False)
    check(PQ + "@offload", [], failures, want_preemptions=False)
    check(PQ + ",cache=24,policy=lfu@offload", [], failures, want_preemptions=False)
    # 12 blocks and 200 tokens each: the longest request needs 10 alone (391 prompt tokens and 200 more). The
    # scheduler admits a prompt when its blocks + 1 fit, so requests admitted together fill the pool with
    # prompts, and each then grows by 3-4 blocks: whatever the arrival order, some must be preempted (with
    # 40 tokens only two requests cross a block boundary, and a run on an H100 preempted none).
    check(PQ, ["--kv-cache-bytes", str(12 * BLOCK_BYTES)], failures, want_preemptions=True, max_tokens=200)
    for failure in failures:
        print("FAIL:", failure)
    print("served on cuda: ok" if not failures else f"served on cuda: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
