#!/usr/bin/env python3
"""A fake slimkv worker for the router's tests: the worker side of docs/disaggregated.md's contract
(/health, /internal/v1/prefill on a prefill worker, kv_transfer streams on a decode worker), with a
deterministic toy "model" instead of an engine, so that the router's dispatch, re-dispatch and fault
handling are tested apart from the real workers (tests/router/router_e2e_test.py runs those).

The toy model: a prompt's token ids are its UTF-8 bytes (chat: "role:content\\n" per message); the
next token after ids is next_token(ids), a function of all of them, so a decode worker that resumed from
wrong ids would write a different text; token t reads " w<t>". A prefill worker "sends the KV" by
POSTing the prompt ids, resume ids and its sampled next token to the decode worker's kv_address.

Faults on command (POST /control, JSON): {"fail_next": "500" | "503" | "reset" | "hang" | "die"} for the
next prefill or decode request; {"die_after_tokens": K}: a decode worker exits (os._exit) after K tokens
of its next stream, mid-generation; {"healthy": false}: /health answers 503. GET /stats: counters.

Usage: fake_worker.py --role prefill|decode [--port 0] [--model NAME] [--kv-spec SPEC] [--token-delay-s S]
Prints "listening on http://127.0.0.1:PORT" once it serves. Debian's python3 only.
"""
import argparse
import http.client
import http.server
import json
import os
import socket
import sys
import threading
import time

VOCAB = 1000


def next_token(ids):
    """The toy model: the next token of a sequence, from every id in it (a resume from wrong ids shows)."""
    value = 17
    for position, token in enumerate(ids):
        value = (value * 31 + token * (position % 7 + 1)) % 1000003
    return value % (VOCAB - 1) + 1  # never 0: the toy model ends on length only


def token_text(token):
    return f" w{token}"


def prompt_ids(endpoint, request):
    if endpoint == "/v1/chat/completions":
        return list("".join(f"{m['role']}:{m['content']}\n" for m in request["messages"]).encode())
    prompt = request["prompt"]
    return list(prompt) if isinstance(prompt, list) else list(prompt.encode())


def expected_tokens(endpoint, request):
    """What a correct worker pair answers: max_tokens (default 16) tokens of the toy model."""
    ids, out = prompt_ids(endpoint, request), []
    for _ in range(request.get("max_tokens", 16)):
        out.append(next_token(ids + out))
    return out


def expected_text(endpoint, request):
    return "".join(token_text(t) for t in expected_tokens(endpoint, request))


def error_body(message, param=None, type_="invalid_request_error", code=None):
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def validate(endpoint, request, model):
    """serve's checks that matter here: (status, error body) or None."""
    if not isinstance(request, dict):
        return 400, error_body("the body must be a JSON object")
    if "model" in request and request["model"] not in (None, model):
        return 404, error_body(f"the model '{request['model']}' does not exist here; this server serves '{model}'",
                               "model", code="model_not_found")
    max_tokens = request.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return 400, error_body("max_tokens: must be an integer >= 1", "max_tokens")
    if endpoint == "/v1/chat/completions":
        if not isinstance(request.get("messages"), list) or not request["messages"]:
            return 400, error_body("messages: is required, a non-empty list", "messages")
    elif not isinstance(request.get("prompt"), (str, list)) or not request["prompt"]:
        return 400, error_body("prompt: is required", "prompt")
    return None


class Worker:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Condition()
        self.kv = {}  # request_id -> what the prefill worker sent
        self.faults = {}
        self.healthy = True
        self.stats = {"prefills": 0, "streams": 0, "cancelled": 0, "completed": 0, "resumed_from": []}
        self.running = 0
        self.kv_address = None

    def take_fault(self, key):
        with self.lock:
            return self.faults.pop(key, None)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    worker = None  # set by main

    def log_message(self, *args):
        pass

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self):
        length = int(self.headers.get("Content-Length", 0))
        try:
            return json.loads(self.rfile.read(length))
        except ValueError:
            return None

    def do_GET(self):
        worker = self.worker
        if self.path == "/health":
            if not worker.healthy:
                return self.send_json(503, error_body("told to be unhealthy", type_="service_unavailable"))
            health = {"status": "ok", "role": worker.args.role, "model": worker.args.model,
                      "kv_spec": worker.args.kv_spec, "running": worker.running, "waiting": 0}
            if worker.args.role == "decode":
                health["kv_address"] = worker.kv_address
            return self.send_json(200, health)
        if self.path == "/stats":
            with worker.lock:
                return self.send_json(200, worker.stats)
        if self.path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [{"id": worker.args.model, "object": "model"}]})
        self.send_json(404, error_body(f"no endpoint {self.path}"))

    def do_POST(self):
        worker = self.worker
        body = self.read_json()
        if self.path == "/control":
            with worker.lock:
                worker.faults.update({k: v for k, v in body.items() if k != "healthy"})
                worker.healthy = body.get("healthy", worker.healthy)
            return self.send_json(200, {"ok": True})
        if self.path == "/fake_kv" and worker.args.role == "decode":
            if body["kv_spec"] != worker.args.kv_spec:
                return self.send_json(409, error_body(
                    f"KV spec mismatch: prefill '{body['kv_spec']}', decode '{worker.args.kv_spec}'",
                    type_="kv_refused", code="kv_refused"))
            with worker.lock:
                worker.kv[body["request_id"]] = body
                worker.lock.notify_all()
            return self.send_json(200, {"ok": True})
        if self.path == "/internal/v1/prefill" and worker.args.role == "prefill":
            return self.prefill(body)
        if self.path in ("/v1/completions", "/v1/chat/completions") and worker.args.role == "decode":
            return self.decode(body)
        self.send_json(404, error_body(f"no endpoint {self.path}"))

    def fail(self, fault):
        """Acts out a commanded fault; True when the request is over."""
        if fault == "die":
            os._exit(1)
        if fault == "hang":
            time.sleep(3600)
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.connection.close()
            self.close_connection = True
            return True
        if fault in ("500", "503"):
            self.send_json(int(fault), error_body(f"told to fail with {fault}", type_="server_error"))
            return True
        return False

    def prefill(self, body):
        worker = self.worker
        with worker.lock:
            worker.stats["prefills"] += 1
        if self.fail(worker.take_fault("fail_next")):
            return
        request, endpoint = body["request"], body["endpoint"]
        invalid = validate(endpoint, request, worker.args.model)
        if invalid:
            return self.send_json(*invalid)
        ids = prompt_ids(endpoint, request) + body.get("resume_token_ids", [])
        kv = {"request_id": body["request_id"], "endpoint": endpoint, "request": request,
              "prompt_ids": prompt_ids(endpoint, request), "resume_token_ids": body.get("resume_token_ids", []),
              "next_token": next_token(ids), "kv_spec": worker.args.kv_spec}
        host, port = body["decode_kv_address"].rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("POST", "/fake_kv", body=json.dumps(kv), headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            answer_body = json.loads(answer.read())
        except OSError as e:
            return self.send_json(503, error_body(f"cannot send the KV to {body['decode_kv_address']}: {e}",
                                                  type_="server_error"))
        finally:
            connection.close()
        if answer.status != 200:
            return self.send_json(answer.status, answer_body)
        self.send_json(200, {"request_id": body["request_id"], "prompt_tokens": len(kv["prompt_ids"]),
                             "kv_bytes": 1024 * len(ids), "transfer_seconds": 0.001, "next_token": kv["next_token"]})

    def decode(self, request):
        worker = self.worker
        endpoint = self.path
        if self.fail(worker.take_fault("fail_next")):
            return
        invalid = validate(endpoint, request, worker.args.model)
        if invalid:
            return self.send_json(*invalid)
        transfer = request.get("kv_transfer")
        if transfer:
            deadline = time.time() + transfer["timeout_s"]
            with worker.lock:
                while transfer["request_id"] not in worker.kv and time.time() < deadline:
                    worker.lock.wait(0.05)
                kv = worker.kv.pop(transfer["request_id"], None)
            if kv is None:
                return self.send_json(504, error_body("the KV did not arrive in time", type_="timeout"))
            prompt, resumed, first = kv["prompt_ids"], kv["resume_token_ids"], kv["next_token"]
        else:
            prompt, resumed = prompt_ids(endpoint, request), []
            first = next_token(prompt)
        die_after = worker.take_fault("die_after_tokens")
        with worker.lock:
            worker.stats["streams"] += 1
            worker.stats["resumed_from"].append(len(resumed))
            worker.running += 1
        try:
            self.stream(endpoint, request, prompt, resumed, first, die_after)
        except (BrokenPipeError, ConnectionResetError):
            with worker.lock:
                worker.stats["cancelled"] += 1
        finally:
            with worker.lock:
                worker.running -= 1

    def stream(self, endpoint, request, prompt, resumed, first, die_after):
        chat = endpoint == "/v1/chat/completions"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(payload):
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def chunk(text, token_ids, finish):
            choice = {"index": 0, "finish_reason": finish, "token_ids": token_ids}
            if chat:
                choice["delta"] = {"content": text} if text else {}
            else:
                choice["text"] = text
            return json.dumps({"id": "cmpl-fake", "object": "chunk", "model": self.worker.args.model, "choices": [choice]})

        if chat:  # serve's first chat chunk: the role, no tokens
            event(json.dumps({"id": "cmpl-fake", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                              "finish_reason": None}]}))
        max_tokens = request.get("max_tokens", 16)
        generated = list(resumed)
        token = first
        sent = 0
        while True:
            generated.append(token)
            finish = "length" if len(generated) >= max_tokens else None
            time.sleep(self.worker.args.token_delay_s)
            event(chunk(token_text(token), [token], finish))
            sent += 1
            if die_after is not None and sent >= die_after and not finish:
                os._exit(1)  # a crash mid-generation: the router sees the stream cut
            if finish:
                break
            token = next_token(prompt + generated)
        event(json.dumps({"id": "cmpl-fake", "choices": [], "usage": {
            "prompt_tokens": len(prompt), "completion_tokens": len(generated),
            "total_tokens": len(prompt) + len(generated)}}))
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        with self.worker.lock:
            self.worker.stats["completed"] += 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=["prefill", "decode"], required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--kv-spec", default="dense")
    parser.add_argument("--token-delay-s", type=float, default=0.005)
    args = parser.parse_args()
    worker = Worker(args)
    Handler.worker = worker
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    worker.kv_address = f"127.0.0.1:{port}"  # the fake KV transport is this same HTTP server
    print(f"fake {args.role} worker: listening on http://127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
