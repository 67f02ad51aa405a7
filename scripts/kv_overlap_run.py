#!/usr/bin/env python3
"""One lone request through a prefill and a decode worker on loopback (`slimkv serve --role prefill|decode`,
the KV over TCP at --kv-bandwidth-gbps), driven as the router drives them, to see whether the KV's
transfer hides behind the prefill (issue 23). Prints, per request, the decode worker's time to its first
token, the prefill worker's answer's `transfer_seconds` and `kv_timing` (docs/disaggregated.md, "Where
the overlap went"): the prefill's span, what the decode worker waited beyond it, the sender's time in its
frames and the part of it slept for the cap, and the receiver's own account. Each worker computes on 2
threads (tests/serve/slimkv_server.py's).

  scripts/kv_overlap_run.py --slimkv build/release/slimkv --model DIR [--spec dense:dtype=f16]
      [--prompt-tokens 4096] [--gbps 1] [--chunk 512] [--requests 2] [--serve-args "--device cuda"]

A random model with a large KV for its compute: scripts/make_random_model.py --shape kv-heavy. Debian's
python3 only.
"""
import argparse
import json
import os
import random
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve"))
from slimkv_server import Server  # noqa: E402


def one_request(prefill, decode, prompt, timeout_s=600):
    """The prompt through both workers; (seconds to the decode worker's first token, the prefill answer)."""
    request_id = uuid.uuid4().hex
    kv_address = decode.get("/health")[2]["kv_address"]
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    to_decode = dict(body, stream=True, kv_transfer={"request_id": request_id, "timeout_s": timeout_s})
    result = {}
    start = time.monotonic()

    def run_decode():
        result["decode"] = decode.stream("/v1/completions", to_decode)
        result["decode_end"] = time.monotonic() - start

    thread = threading.Thread(target=run_decode)
    thread.start()
    status, _, answer = prefill.post("/internal/v1/prefill", {
        "request_id": request_id, "endpoint": "/v1/completions", "request": body, "decode_kv_address": kv_address})
    thread.join(timeout=timeout_s)
    if status != 200 or result["decode"][0] != 200:
        raise RuntimeError(f"prefill answered {status}: {answer}; decode {result['decode'][0]}")
    return result["decode_end"], answer


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slimkv", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--spec", default="dense:dtype=f16")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--gbps", type=float, default=1.0)
    parser.add_argument("--chunk", type=int, default=512, help="--prefill-chunk-tokens of the prefill worker")
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--serve-args", default="", help="more arguments for both workers (\"--device cuda ...\")")
    args = parser.parse_args()
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    common = args.serve_args.split() + ["--kv", args.spec, "--max-num-seqs", "2", "--max-model-len", str(args.prompt_tokens + 64)]
    with Server(args.slimkv, args.model, common + ["--role", "prefill", "--kv-bandwidth-gbps", str(args.gbps),
                                                   "--prefill-chunk-tokens", str(args.chunk)]) as prefill, \
            Server(args.slimkv, args.model, common + ["--role", "decode", "--kv-port", "0"]) as decode:
        rng = random.Random(0)
        for r in range(args.requests):
            prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
            first_token_s, answer = one_request(prefill, decode, prompt)
            timing = answer.get("kv_timing", {})
            print(json.dumps({"request": r, "first_token_seconds": round(first_token_s, 3), "kv_bytes": answer["kv_bytes"],
                              "transfer_seconds": round(answer["transfer_seconds"], 3), "kv_timing": timing}), flush=True)


if __name__ == "__main__":
    main()
