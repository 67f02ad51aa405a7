#!/usr/bin/env python3
"""slimkv serve --role prefill|decode on loopback, driven with Python's http.client as the router of
docs/disaggregated.md would drive them (no router here): the client request to the decode worker with
kv_transfer, /internal/v1/prefill to the prefill worker at the same time. Greedy outputs equal a
--role both server's for dense, hack:bits=4, hack:bits=2,pi=64 and that with two heads at 4 bits (hiheads=),
a long prompt streamed chunk by chunk;
a resume from generated tokens
continues the same completion; mismatched workers are refused naming both specs; a stream that never
comes is a 504.

Usage: disaggregated_test.py SLIMKV_BINARY SOURCE_DIR [SERVE_ARGS...]
SERVE_ARGS go to every server, e.g. `--device cuda` (both workers on one GPU: the KV moves by CUDA IPC,
which the prefill worker's answer must say) or `--device cuda --kv-transport tcp`; `--model DIR` among
them replaces the bundled model; `--two-gpus` (not passed on) runs the decode worker on the second GPU
(`--device cuda:1`, both GPUs visible to both workers, as NCCL needs), `--two-gpus=visible-devices` the
older way (its CUDA_VISIBLE_DEVICES lists that GPU first, and it runs on `cuda`): the KV moves by NCCL
unless told tcp. `--spec=SPEC` (repeatable, not passed on) runs these specs instead of the default ones,
and not the mismatch check: e.g. `--spec=pq:m=2,b=4,topk=0.25,local=16,init=4,segment=64@offload` with
`--device cuda` (pq keeps no device pages on the GPU: its KV goes over TCP, the decode worker rebuilding
the PQ index from the keys)."""
import os
import sys
import threading
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slimkv_server import Server, stream_text  # noqa: E402

SLIMKV, SOURCE, EXTRA = sys.argv[1], sys.argv[2], sys.argv[3:]
MODEL = os.path.join(SOURCE, "models", "slimkv-llama-15m")
if "--model" in EXTRA:  # another model than the bundled one (the GPU run's Llama-3-8B-shaped one)
    at = EXTRA.index("--model")
    MODEL = EXTRA[at + 1]
    del EXTRA[at:at + 2]
SPECS = [arg[len("--spec="):] for arg in EXTRA if arg.startswith("--spec=")]
EXTRA = [arg for arg in EXTRA if not arg.startswith("--spec=")]
TWO_GPUS = next((arg for arg in EXTRA if arg in ("--two-gpus", "--two-gpus=visible-devices")), None)
if TWO_GPUS:
    EXTRA.remove(TWO_GPUS)
BY_VISIBLE_DEVICES = TWO_GPUS == "--two-gpus=visible-devices"
# Every GPU of the host stays visible to each worker (NCCL reaches the other GPU only through a GPU it
# sees); the decode worker runs on the second: `--device cuda:1`, or first in its list.
PREFILL_ENV = {"CUDA_VISIBLE_DEVICES": "0,1"} if TWO_GPUS else None
DECODE_ENV = {"CUDA_VISIBLE_DEVICES": "1,0" if BY_VISIBLE_DEVICES else "0,1"} if TWO_GPUS else None
# The transport the prefill workers must report: CUDA IPC between two workers of one GPU, NCCL between
# two GPUs, unless told tcp.
ON_GPU = "--device" in EXTRA and EXTRA[EXTRA.index("--device") + 1].startswith("cuda")
WANT_TRANSPORT = ("nccl" if TWO_GPUS else "cuda_ipc") if ON_GPU and "tcp" not in EXTRA else "tcp"
PROMPTS = [
    "The history of the river begins in the mountains, where",
    # Long enough for sealed blocks (64 tokens) and an open block in every layer.
    " ".join(["Once upon a time there was a small village by the sea, and every morning the fishermen"] * 8),
]
MAX_TOKENS = 24


def decode_args(args):
    """A decode worker's server arguments: `args`, with `--device cuda` made `cuda:1` under --two-gpus."""
    if not TWO_GPUS or BY_VISIBLE_DEVICES or "--device" not in args:
        return args
    at = args.index("--device") + 1
    return args[:at] + ["cuda:1"] + args[at + 1:]


def disaggregated(prefill, decode, body, resume=(), timeout_s=60):
    """Runs `body` through decode + prefill as a router would; returns (D's status, events, P's answer)."""
    request_id = uuid.uuid4().hex
    kv_address = decode.get("/health")[2]["kv_address"]
    to_decode = dict(body, stream=True, stream_options={"include_usage": True},
                     kv_transfer={"request_id": request_id, "timeout_s": timeout_s})
    result = {}

    def run_decode():
        result["decode"] = decode.stream("/v1/completions", to_decode)

    thread = threading.Thread(target=run_decode)
    thread.start()
    result["prefill"] = prefill.post("/internal/v1/prefill", {
        "request_id": request_id, "endpoint": "/v1/completions", "request": body,
        "decode_kv_address": kv_address, "resume_token_ids": list(resume)})
    thread.join(timeout=timeout_s + 30)
    assert not thread.is_alive(), "the decode worker's stream did not end"
    status, events = result["decode"]
    return status, events, result["prefill"]


def token_ids_of(events):
    ids = []
    for event in events:
        if event != "[DONE]" and event.get("choices"):
            assert "token_ids" in event["choices"][0], f"a kv_transfer chunk without token_ids: {event}"
            ids += event["choices"][0]["token_ids"]
    return ids


def usage_of(events):
    return [e for e in events if e != "[DONE]" and e.get("usage")][-1]["usage"]


def check_spec(spec, failures):
    # 64-token steps: the long prompt is prefilled in chunks, whose sealed blocks travel while the next
    # chunks compute (KV_BLOCKS frames), as a long prompt's do at the default 512.
    args = ["--kv", spec, "--prefill-chunk-tokens", "64"] + EXTRA
    # A selector (pq): on the GPU its cache has no device pages, so its KV goes over TCP; and a resumed
    # request's generated tokens are prefilled, attending to every token where the colocated server's
    # decode steps selected, so its KV and continuation differ by design (no resume check).
    selects = spec.startswith("pq")
    want_transport = "tcp" if selects else WANT_TRANSPORT
    with Server(SLIMKV, MODEL, args) as both, Server(SLIMKV, MODEL, args + ["--role", "prefill"], env=PREFILL_ENV) as prefill, \
            Server(SLIMKV, MODEL, decode_args(args) + ["--role", "decode", "--kv-port", "0"], env=DECODE_ENV) as decode:
        health = decode.get("/health")[2]
        assert health["role"] == "decode" and health["status"] == "ok", health
        assert prefill.get("/health")[2]["role"] == "prefill"
        assert both.get("/health")[2]["kv_spec"] == health["kv_spec"]
        for prompt in PROMPTS:
            body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
            status, _, expected = both.post("/v1/completions", body)
            assert status == 200, expected
            want_text = expected["choices"][0]["text"]
            status, events, (p_status, _, p_answer) = disaggregated(prefill, decode, body)
            if p_status != 200 or status != 200:
                failures.append(f"{spec}: prefill {p_status} {p_answer}, decode {status} {events}")
                continue
            text, finish = stream_text(events)
            ids = token_ids_of(events)
            usage = usage_of(events)
            if text != want_text or finish != expected["choices"][0]["finish_reason"]:
                failures.append(f"{spec}: disaggregated {text!r} ({finish}) != colocated {want_text!r}")
            if usage != expected["usage"] or len(ids) != usage["completion_tokens"]:
                failures.append(f"{spec}: usage {usage} / {len(ids)} token ids != colocated {expected['usage']}")
            if p_answer["next_token"] != ids[0] or p_answer["kv_bytes"] <= 0 or p_answer["kv_transport"] != want_transport:
                failures.append(f"{spec}: prefill answer {p_answer} vs first token {ids[0]}, transport {want_transport}")
            # Where the transfer's time went: the prefill's span, what came after it, the receiver's account.
            timing = p_answer.get("kv_timing", {})
            if not (0 <= timing.get("first_piece_seconds", -1) <= timing.get("prefill_seconds", -1)
                    and timing.get("after_prefill_seconds", -1) >= 0 and timing.get("receiver", {}).get("seconds", -1) > 0):
                failures.append(f"{spec}: prefill answer's kv_timing {timing}")
            if selects:
                continue
            # Resumed after 5 tokens (as a router does when a decode worker dies): the rest is the same.
            k = 5
            status, events, (p_status, _, p_answer) = disaggregated(prefill, decode, body, resume=ids[:k])
            if p_status != 200 or status != 200:
                failures.append(f"{spec}: resume: prefill {p_status} {p_answer}, decode {status} {events}")
                continue
            resumed_text, _ = stream_text(events)
            if token_ids_of(events) != ids[k:] or usage_of(events) != usage:
                failures.append(f"{spec}: resume gave ids {token_ids_of(events)} usage {usage_of(events)}, "
                                f"expected {ids[k:]} {usage}")
            if not resumed_text or not want_text.endswith(resumed_text):
                failures.append(f"{spec}: resumed text {resumed_text!r} does not end {want_text!r}")
        # A request the prefill worker refuses as serve would: 400 naming the field.
        status, _, answer = prefill.post("/internal/v1/prefill", {
            "request_id": uuid.uuid4().hex, "endpoint": "/v1/completions",
            "request": {"prompt": "x", "max_tokens": -1}, "decode_kv_address": health["kv_address"]})
        if status != 400 or answer["error"]["param"] != "max_tokens":
            failures.append(f"{spec}: bad request to prefill: {status} {answer}")
        # A stream that never comes: 504 after timeout_s.
        status, events = decode.stream("/v1/completions", {"prompt": "x", "max_tokens": 2, "stream": True,
                                                            "kv_transfer": {"request_id": "nobody", "timeout_s": 0.5}})
        if status != 504 or events[0]["error"]["type"] != "timeout":
            failures.append(f"{spec}: missing stream: {status} {events}")
        # Without kv_transfer a decode worker serves the request itself.
        status, _, own = decode.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS,
                                                         "temperature": 0, "ignore_eos": True})
        if status != 200:
            failures.append(f"{spec}: colocated request on a decode worker: {status} {own}")


def check_mismatch(failures):
    with Server(SLIMKV, MODEL, ["--kv", "dense", "--role", "prefill"] + EXTRA, env=PREFILL_ENV) as prefill, \
            Server(SLIMKV, MODEL, ["--kv", "hack:bits=2,pi=64", "--role", "decode", "--kv-port", "0"] + decode_args(EXTRA),
                   env=DECODE_ENV) as decode:
        p_spec, d_spec = prefill.get("/health")[2]["kv_spec"], decode.get("/health")[2]["kv_spec"]
        body = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
        status, events, (p_status, _, p_answer) = disaggregated(prefill, decode, body, timeout_s=2)
        message = p_answer.get("error", {}).get("message", "")
        if p_status != 409 or p_answer["error"]["type"] != "kv_refused" or p_spec not in message or d_spec not in message:
            failures.append(f"mismatch: prefill answered {p_status} {p_answer} (specs {p_spec} / {d_spec})")
        if status != 504:  # the router would cancel it; unattended, it times out
            failures.append(f"mismatch: decode answered {status} {events}")


def main():
    failures = []
    # Under ASan (ctest sets SLIMKV_SANITIZED) dense, 2-bit and 2-bit with two heads at 4 bits (each
    # head's blocks in slots of its own size): hack:bits=4 crosses the same transfer code with another
    # codec's blocks (KvTransfer.RoundTripIsLosslessForEveryCodecAndLength checks every codec under ASan);
    # all four run in the release build.
    specs = SPECS or ["dense", "hack:bits=4", "hack:bits=2,pi=64", "hack:bits=2,pi=64,hibits=4,hiheads=1.0/6.1"]
    if os.environ.get("SLIMKV_SANITIZED") and not SPECS:
        specs.remove("hack:bits=4")
    for spec in specs:
        check_spec(spec, failures)
    if not SPECS:
        check_mismatch(failures)
    for failure in failures:
        print("FAIL:", failure)
    print("disaggregated: ok" if not failures else f"disaggregated: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
