"""slimkv router over fake workers (tests/router/fake_worker.py: the contract's worker side with a toy
model and faults on command), through Python's http.client: dispatch by load, streaming and whole
answers, 4xx relayed unchanged, a decode worker killed mid-stream (the client still gets one complete,
correct response), a prefill worker that fails/resets/hangs/dies (retried elsewhere), down workers probed
back, a client that leaves (the workers' requests are cancelled), bounded retries, KV refusal, auth.
Usage: router_test.py SLIMKV_BINARY SOURCE_DIR (ctest runs it; loopback only)."""
import json
import os
import socket
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "serve"))
import fake_worker  # noqa: E402
from slimkv_server import Process, stream_text  # noqa: E402

SLIMKV = sys.argv[1]
FAKE = [sys.executable, os.path.join(HERE, "fake_worker.py")]
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def fake(role, *args):
    return Process(FAKE + ["--role", role] + list(args), name=f"fake-{role}")


class Cluster:
    """Fake prefill and decode workers behind a router, for one test."""

    def __init__(self, prefill=2, decode=2, router_args=(), decode_args=(), prefill_args=()):
        self.prefill = [fake("prefill", *prefill_args).__enter__() for _ in range(prefill)]
        self.decode = [fake("decode", *decode_args).__enter__() for _ in range(decode)]
        command = [SLIMKV, "router", "--port", "0", "--prefill", ",".join(w.url for w in self.prefill),
                   "--decode", ",".join(w.url for w in self.decode), "--health-interval-s", "0.2",
                   "--connect-timeout-s", "1", "--read-timeout-s", "3", "--kv-timeout-s", "5"] + list(router_args)
        self.router = Process(command, name="slimkv-router").__enter__()

    def close(self):
        self.router.stop(timeout_s=60)
        for worker in self.prefill + self.decode:
            if worker.process.poll() is None:
                worker.kill()
            worker.__exit__(None, None, None)
        self.router.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stats(self, worker):
        status, _, stats = worker.get("/stats")
        assert status == 200
        return stats

    def metric(self, name, labels):
        """A labelled sample of the router's /metrics."""
        status, _, text = self.router.get("/metrics")
        assert status == 200
        for line in text.decode().splitlines():
            if line.startswith(name + "{") and all(label in line for label in labels):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError((name, labels))

    def wait_for(self, condition, timeout_s=10, what="condition"):
        deadline = time.time() + timeout_s
        while not condition():
            if time.time() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.router.output()}")
            time.sleep(0.05)


def request_body(endpoint, max_tokens=12, **fields):
    if endpoint == CHAT:
        body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": max_tokens}
    else:
        body = {"prompt": "The river flows", "max_tokens": max_tokens}
    body.update(fields)
    return body


def expected(endpoint, body):
    return fake_worker.expected_text(endpoint, body)


class RouterTest(unittest.TestCase):
    def check_whole(self, cluster, endpoint, body):
        status, _, response = cluster.router.post(endpoint, body)
        self.assertEqual(status, 200, response)
        choice = response["choices"][0]
        text = choice["message"]["content"] if endpoint == CHAT else choice["text"]
        self.assertEqual(text, expected(endpoint, body))
        self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(response["usage"]["completion_tokens"], body["max_tokens"])
        self.assertEqual(response["object"], "chat.completion" if endpoint == CHAT else "text_completion")
        return response

    def check_stream(self, cluster, endpoint, body):
        status, events = cluster.router.stream(endpoint, dict(body, stream=True))
        self.assertEqual(status, 200, events)
        self.assertEqual(events[-1], "[DONE]")
        text, finish = stream_text(events)
        self.assertEqual(text, expected(endpoint, body))
        self.assertEqual(finish, "length")
        chunks = [e for e in events if e != "[DONE]"]
        self.assertEqual(len({e["id"] for e in chunks}), 1, "one response id for the whole stream")
        for chunk in chunks:
            self.assertNotIn("token_ids", json.dumps(chunk), "the router strips the workers' token_ids")
        if endpoint == CHAT:
            self.assertEqual(chunks[0]["choices"][0]["delta"].get("role"), "assistant")
            self.assertEqual(sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]), 1)
        return events

    def test_dispatch_streaming_and_whole(self):
        with Cluster() as cluster:
            for endpoint in (COMPLETIONS, CHAT):
                self.check_whole(cluster, endpoint, request_body(endpoint))
                events = self.check_stream(cluster, endpoint, request_body(endpoint))
                self.assertNotIn("usage", events[0], "no usage fields unless the client asked")
                events = self.check_stream(cluster, endpoint, request_body(endpoint, stream_options={"include_usage": True}))
                self.assertEqual(events[-2]["usage"]["completion_tokens"], 12)
            # Concurrent requests spread over both decode and both prefill workers (least loaded first).
            results = []

            def one(i):
                body = {"prompt": f"request {i}", "max_tokens": 30}
                status, _, response = cluster.router.post(COMPLETIONS, body)
                results.append(status == 200 and response["choices"][0]["text"] == expected(COMPLETIONS, body))

            threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            self.assertEqual(results, [True] * 8)
            for worker in cluster.decode:
                self.assertGreater(cluster.stats(worker)["streams"], 1)
            for worker in cluster.prefill:
                self.assertGreater(cluster.stats(worker)["prefills"], 1)
            self.assertEqual(cluster.metric("slimkv_router:requests_total", ['outcome="ok"']), 14)
            status, _, models = cluster.router.get("/v1/models")
            self.assertEqual((status, models["data"][0]["id"]), (200, "fake-model"))
            status, _, health = cluster.router.get("/health")
            self.assertEqual((status, health["prefill_up"], health["decode_up"]), (200, 2, 2))

    def test_client_errors_relayed_unchanged(self):
        with Cluster(prefill=1, decode=1) as cluster:
            # The prefill worker's 404 (a model it does not serve), byte for byte; the decode worker's
            # request, which waited for KV, is cut at once (not after its KV timeout).
            started = time.time()
            status, _, response = cluster.router.post(COMPLETIONS, request_body(COMPLETIONS, model="gpt-4o"))
            self.assertEqual(status, 404)
            self.assertEqual(response, fake_worker.validate(COMPLETIONS, {"model": "gpt-4o", "prompt": "x"}, "fake-model")[1])
            self.assertLess(time.time() - started, 3)
            status, events = cluster.router.stream(COMPLETIONS, request_body(COMPLETIONS, model="gpt-4o", stream=True))
            self.assertEqual(status, 404, events)
            # What serve's own checks refuse is refused by the router with serve's words, before any worker.
            status, _, response = cluster.router.post(COMPLETIONS, request_body(COMPLETIONS, max_tokens=-1))
            self.assertEqual((status, response["error"]["param"]), (400, "max_tokens"))
            status, _, response = cluster.router.post(COMPLETIONS, b"{not json", raw=True)
            self.assertEqual(status, 400)
            # The decode worker validates the request too and may answer first (a slow, sanitized router
            # sends the prefill after it has the decode worker's 404, then sends none): the prefill
            # worker saw none, one or both of the two requests; the relayed words are the same.
            self.assertIn(cluster.stats(cluster.prefill[0])["prefills"], (0, 1, 2))
            self.assertEqual(cluster.metric("slimkv_router:requests_total", ['outcome="client_error"']), 4)
            self.assertEqual(cluster.metric("slimkv_router:retries_total", ['role="prefill"']), 0)
            self.check_whole(cluster, COMPLETIONS, request_body(COMPLETIONS))  # still serving

    def test_decode_worker_killed_mid_stream_resumes(self):
        for stream in (False, True):
            with self.subTest(stream=stream), Cluster(prefill=1, decode=2) as cluster:
                # Both idle: the first listed decode worker is picked; it dies after 5 of 20 tokens.
                cluster.decode[0].post("/control", {"die_after_tokens": 5})
                body = request_body(COMPLETIONS, max_tokens=20)
                if stream:
                    self.check_stream(cluster, COMPLETIONS, body)
                else:
                    self.check_whole(cluster, COMPLETIONS, body)
                self.assertEqual(cluster.stats(cluster.decode[1])["resumed_from"], [5])
                self.assertEqual(cluster.metric("slimkv_router:retries_total", ['role="decode"']), 1)
                self.assertEqual(cluster.metric("slimkv_router:worker_up", [cluster.decode[0].url]), 0)
                self.assertIn("decode worker " + cluster.decode[0].url + " is down", cluster.router.output())
        with Cluster(prefill=1, decode=2) as cluster:  # chat, with usage: the whole request counted
            cluster.decode[0].post("/control", {"die_after_tokens": 3})
            events = self.check_stream(cluster, CHAT, request_body(CHAT, max_tokens=9, stream_options={"include_usage": True}))
            self.assertEqual(events[-2]["usage"]["completion_tokens"], 9)

    def test_prefill_failures_retried_elsewhere(self):
        for fault in ("500", "503", "reset", "hang", "die"):
            with self.subTest(fault=fault), Cluster(prefill=2, decode=1) as cluster:
                cluster.prefill[0].post("/control", {"fail_next": fault})
                started = time.time()
                self.check_whole(cluster, COMPLETIONS, request_body(COMPLETIONS))
                self.assertLess(time.time() - started, 8, "a hung worker is timed out (--read-timeout-s 3)")
                self.assertEqual(cluster.stats(cluster.prefill[1])["prefills"], 1)
                self.assertEqual(cluster.metric("slimkv_router:retries_total", ['role="prefill"']), 1)
                # A worker that broke the connection is down until its /health answers; one that answered
                # 500 is alive; 503 says "not now".
                up = cluster.metric("slimkv_router:worker_up", [cluster.prefill[0].url])
                if fault == "die":
                    self.assertEqual(up, 0)

    def test_down_worker_probed_back(self):
        with Cluster(prefill=1, decode=2) as cluster:
            port = cluster.decode[0].port
            cluster.decode[0].kill()
            cluster.wait_for(lambda: cluster.metric("slimkv_router:worker_up", [cluster.decode[0].url]) == 0,
                             what="the killed worker marked down")
            for _ in range(3):  # all on the live one, no retries needed
                self.check_whole(cluster, COMPLETIONS, request_body(COMPLETIONS))
            self.assertEqual(cluster.metric("slimkv_router:retries_total", ['role="decode"']), 0)
            # Back on the same port: probed back up, and picked again.
            cluster.decode[0] = fake("decode", "--port", str(port)).__enter__()
            cluster.wait_for(lambda: cluster.metric("slimkv_router:worker_up", [cluster.decode[0].url]) == 1,
                             what="the restarted worker probed back")
            for endpoint in (COMPLETIONS, CHAT, COMPLETIONS):
                self.check_whole(cluster, endpoint, request_body(endpoint))
            self.assertGreater(cluster.stats(cluster.decode[0])["streams"], 0)
            # Told to be unhealthy (503 on /health, as while loading): down, then up again.
            cluster.decode[1].post("/control", {"healthy": False})
            cluster.wait_for(lambda: cluster.metric("slimkv_router:worker_up", [cluster.decode[1].url]) == 0)
            cluster.decode[1].post("/control", {"healthy": True})
            cluster.wait_for(lambda: cluster.metric("slimkv_router:worker_up", [cluster.decode[1].url]) == 1)

    def test_client_disconnect_cancels_upstream(self):
        with Cluster(prefill=1, decode=1, decode_args=["--token-delay-s", "0.05"]) as cluster:
            connection = socket.create_connection(("127.0.0.1", cluster.router.port), timeout=10)
            body = json.dumps(request_body(COMPLETIONS, max_tokens=400, stream=True)).encode()
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            received = b""
            while received.count(b"data: ") < 3:
                received += connection.recv(4096)
            connection.close()
            decode = cluster.decode[0]
            cluster.wait_for(lambda: cluster.stats(decode)["cancelled"] == 1, what="the decode worker's stream cancelled")
            self.assertEqual(cluster.stats(decode)["completed"], 0)
            cluster.wait_for(lambda: cluster.metric("slimkv_router:requests_total", ['outcome="cancelled"']) == 1)
            self.assertEqual(cluster.metric("slimkv_router:worker_in_flight", [decode.url]), 0)

    def test_client_leaving_a_whole_answer_cancels_upstream(self):
        # stream false: nothing is written until the end, so the router watches the connection itself.
        with Cluster(prefill=1, decode=1, decode_args=["--token-delay-s", "0.05"]) as cluster:
            connection = socket.create_connection(("127.0.0.1", cluster.router.port), timeout=10)
            body = json.dumps(request_body(COMPLETIONS, max_tokens=400)).encode()
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            decode = cluster.decode[0]
            cluster.wait_for(lambda: cluster.stats(decode)["streams"] == 1, what="the request on the decode worker")
            time.sleep(0.3)  # a few tokens generated (400 take 20 s)
            connection.close()
            cluster.wait_for(lambda: cluster.stats(decode)["cancelled"] == 1, what="the decode worker's stream cancelled")
            self.assertEqual(cluster.stats(decode)["completed"], 0)
            cluster.wait_for(lambda: cluster.metric("slimkv_router:requests_total", ['outcome="cancelled"']) == 1)

    def test_retries_are_bounded(self):
        with Cluster(prefill=2, decode=1, router_args=["--max-retries", "1"]) as cluster:
            for worker in cluster.prefill:
                worker.post("/control", {"fail_next": "500"})
            status, _, response = cluster.router.post(COMPLETIONS, request_body(COMPLETIONS))
            self.assertEqual(status, 502, response)
            self.assertIn("failed on 2 attempts", response["error"]["message"])
            self.assertIn(cluster.prefill[0].url, response["error"]["message"])
            self.check_whole(cluster, COMPLETIONS, request_body(COMPLETIONS))  # the faults were one-shot
        with Cluster(prefill=1, decode=2, router_args=["--max-retries", "1"]) as cluster:
            # Both decode workers die mid-stream: the client already has tokens, so the stream ends with
            # an error event naming the failures (then [DONE]), not a hang.
            for worker in cluster.decode:
                worker.post("/control", {"die_after_tokens": 2})
            status, events = cluster.router.stream(COMPLETIONS, request_body(COMPLETIONS, stream=True))
            self.assertEqual(status, 200)
            self.assertEqual(events[-1], "[DONE]")
            self.assertIn("failed on 2 attempts", events[-2]["error"]["message"])
            self.assertEqual(stream_text(events)[0], expected(COMPLETIONS, request_body(COMPLETIONS, max_tokens=4)))
            # No decode worker left: 503 at once, naming why.
            status, _, response = cluster.router.post(COMPLETIONS, request_body(COMPLETIONS))
            self.assertEqual(status, 503, response)
            self.assertIn("no decode worker is up", response["error"]["message"])
            status, _, _ = cluster.router.get("/health")
            self.assertEqual(status, 503)

    def test_kv_refused_is_a_502_naming_both_sides(self):
        with Cluster(prefill=1, decode=1, decode_args=["--kv-spec", "hack:bits=2"]) as cluster:
            status, _, response = cluster.router.post(COMPLETIONS, request_body(COMPLETIONS))
            self.assertEqual(status, 502, response)
            self.assertIn("prefill 'dense', decode 'hack:bits=2'", response["error"]["message"])
            self.assertEqual(cluster.stats(cluster.prefill[0])["prefills"], 1, "not retried")

    def test_workers_listed_in_the_wrong_role_are_down(self):
        with Cluster(prefill=1, decode=1) as cluster:
            command = [SLIMKV, "router", "--port", "0", "--prefill", cluster.decode[0].url, "--decode",
                       cluster.prefill[0].url]
            with Process(command, name="slimkv-router", health_path=None) as router:
                time.sleep(0.3)
                status, _, response = router.get("/health")
                self.assertEqual(status, 503)
                self.assertIn("its role is 'decode', listed as a prefill worker", response["error"]["message"])
                router.stop()

    def test_api_key(self):
        with Cluster(prefill=1, decode=1, router_args=["--api-key", "sk-router"]) as cluster:
            status, _, response = cluster.router.post(COMPLETIONS, request_body(COMPLETIONS))
            self.assertEqual((status, response["error"]["code"]), (401, "invalid_api_key"))
            status, _, response = cluster.router.post(COMPLETIONS, request_body(COMPLETIONS),
                                                      headers={"Authorization": "Bearer sk-router"})
            self.assertEqual(status, 200, response)
            self.assertEqual(cluster.router.get("/health")[0], 200)  # probes need no key

    def test_bad_command_lines(self):
        import subprocess
        for args, message in ((["--prefill", "http://127.0.0.1:1", "--decode", "ftp://x:1"], "only http://"),
                              (["--prefill", "127.0.0.1", "--decode", "http://127.0.0.1:1"], "no port"),
                              (["--prefill", "http://127.0.0.1:99999", "--decode", "http://127.0.0.1:1"], "1..65535")):
            done = subprocess.run([SLIMKV, "router", "--port", "0"] + args, capture_output=True, text=True, timeout=30)
            self.assertEqual(done.returncode, 1, done.stderr)
            self.assertIn(message, done.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
