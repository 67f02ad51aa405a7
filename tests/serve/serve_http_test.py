"""slimkv serve through Python's http.client, as a client sees it: the endpoints, greedy output equal to
`slimkv generate`, streaming equal to non-streaming, stop strings, bad inputs (each its documented
status, the server serving on), auth, a client that leaves (mid-stream, or a whole answer while it is
generated or still queued), graceful SIGTERM.
Usage: serve_http_test.py SLIMKV_BINARY SOURCE_DIR (ctest runs it; loopback only)."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slimkv_server import Server, stream_text  # noqa: E402

SLIMKV, SOURCE = sys.argv[1], sys.argv[2]
MODEL = os.path.abspath(os.path.join(SOURCE, "models", "slimkv-llama-15m"))
NAME = "slimkv-llama-15m"
PROMPTS = ["The history of the city", "Once upon a time, there was a little", "In mathematics, a prime number",
           "The river flows", "Scientists have discovered"]


def post_and_leave(server, body):
    """A raw client: sends `body` to /v1/completions over a socket it returns open (close it to leave)."""
    data = json.dumps(body).encode()
    client = socket.create_connection(("127.0.0.1", server.port))
    client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return client


def wait_until(condition, seconds=20):
    """Polls `condition` every 20 ms until it holds or `seconds` pass; returns whether it held."""
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            return False
        time.sleep(0.02)
    return True


def aborted(server):
    """Requests the server ended because their client left (vLLM's finished_reason="abort")."""
    _, _, metrics = server.get("/metrics")
    prefix = 'slimkv:request_success_total{model_name="slimkv-llama-15m",finished_reason="abort"} '
    return next(float(line[len(prefix):]) for line in metrics.decode().splitlines() if line.startswith(prefix))


def completion(server, prompt, max_tokens=24, **fields):
    body = {"model": NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    body.update(fields)
    status, _, response = server.post("/v1/completions", body)
    assert status == 200, (status, response)
    return response


class ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(SLIMKV, MODEL, ["--max-num-seqs", "8", "--max-model-len", "1024"]).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__(None, None, None)

    def assert_serving(self):
        """A bad request never disturbs the others: a good one still works."""
        self.assertEqual(completion(self.server, "Hello", max_tokens=2)["usage"]["completion_tokens"], 2)

    def test_health_and_models(self):
        self.assertEqual(self.server.get("/health")[0], 200)
        status, _, models = self.server.get("/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(models["data"][0]["id"], NAME)
        self.assertEqual(models["data"][0]["max_model_len"], 1024)

    def test_greedy_output_equals_slimkv_generate(self):
        for prompt in PROMPTS[:2]:
            generated = subprocess.run([SLIMKV, "generate", "--model", MODEL, "--prompt", prompt, "--max-tokens", "24",
                                        "--temperature", "0", "--threads", "2"],
                                       capture_output=True, text=True, check=True).stdout
            served = completion(self.server, prompt, max_tokens=24)
            # generate prints the continuation and a newline.
            self.assertEqual(served["choices"][0]["text"] + "\n", generated, prompt)

    def test_streaming_equals_non_streaming_with_usage(self):
        for prompt in PROMPTS:
            whole = completion(self.server, prompt, max_tokens=20)
            status, events = self.server.stream("/v1/completions", {
                "prompt": prompt, "max_tokens": 20, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}})
            self.assertEqual(status, 200)
            self.assertEqual(events[-1], "[DONE]")
            text, finish = stream_text(events)
            self.assertEqual(text, whole["choices"][0]["text"])
            self.assertEqual(finish, whole["choices"][0]["finish_reason"])
            self.assertEqual(events[-2]["choices"], [])
            self.assertEqual(events[-2]["usage"], whole["usage"])
            for event in events[:-2]:
                self.assertIsNone(event["usage"])

    def test_token_id_prompt_and_usage(self):
        status, _, tokens = self.server.post("/tokenize", {"prompt": PROMPTS[0]})
        self.assertEqual(status, 200)
        self.assertEqual(tokens["count"], len(tokens["tokens"]))
        by_ids = completion(self.server, tokens["tokens"], max_tokens=10)
        by_text = completion(self.server, PROMPTS[0], max_tokens=10)
        self.assertEqual(by_ids["choices"][0]["text"], by_text["choices"][0]["text"])
        self.assertEqual(by_ids["usage"], {"prompt_tokens": tokens["count"], "completion_tokens": 10,
                                           "total_tokens": tokens["count"] + 10})
        self.assertEqual(by_ids["choices"][0]["finish_reason"], "length")
        status, _, text = self.server.post("/detokenize", {"tokens": tokens["tokens"]})
        self.assertEqual(status, 200)
        self.assertTrue(text["prompt"].endswith(PROMPTS[0]), text)  # after the BOS token's text, if any

    def test_stop_strings_cut_exactly(self):
        full = completion(self.server, PROMPTS[1], max_tokens=40, ignore_eos=True)["choices"][0]["text"]
        stop = full[12:16]
        cut = full.index(stop)
        for stream in (False, True):
            body = {"prompt": PROMPTS[1], "max_tokens": 40, "temperature": 0, "stop": [stop, "never-there"],
                    "ignore_eos": True}
            if stream:
                status, events = self.server.stream("/v1/completions", dict(body, stream=True))
                text, finish = stream_text(events)
            else:
                status, _, response = self.server.post("/v1/completions", body)
                text, finish = response["choices"][0]["text"], response["choices"][0]["finish_reason"]
            self.assertEqual(status, 200)
            self.assertEqual(text, full[:cut], f"stop={stop!r} stream={stream}")
            self.assertEqual(finish, "stop")

    def test_concurrent_requests_equal_the_same_one_by_one(self):
        prompts = [(PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)), 8 + 3 * i) for i in range(12)]
        alone = [completion(self.server, p, n)["choices"][0]["text"] for p, n in prompts]
        together = [None] * len(prompts)

        def run(i):
            together[i] = completion(self.server, prompts[i][0], prompts[i][1])["choices"][0]["text"]
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(together, alone)

    def test_bad_inputs_get_their_status_and_leave_the_server_serving(self):
        long_prompt = list(range(3, 3 + 1100))
        cases = [  # (body, status, param)
            (b"{not json", 400, None),
            ({"prompt": 5}, 400, "prompt"),
            ({"prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
            ({"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
            ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
            ({"prompt": "x", "temperature": -1}, 400, "temperature"),
            ({"prompt": "x", "n": 3}, 400, "n"),
            ({"prompt": "x", "stop": [1, 2]}, 400, "stop"),
            ({"prompt": [1, 2, 999999]}, 400, "prompt"),
            ({"prompt": long_prompt}, 400, "prompt"),
            ({"prompt": "x", "model": "gpt-4o"}, 404, "model"),
        ]
        for body, status, param in cases:
            got, _, response = self.server.post("/v1/completions", body, raw=isinstance(body, bytes))
            self.assertEqual(got, status, (body if isinstance(body, bytes) else str(body)[:80], response))
            self.assertEqual(set(response["error"]), {"message", "type", "param", "code"})
            self.assertEqual(response["error"]["param"], param, response)
            if param:
                self.assertIn(param, response["error"]["message"])
        status, _, response = self.server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(status, 400, response)  # the bundled model has no chat template
        self.assertEqual(response["error"]["param"], "messages")
        self.assertIn("chat template", response["error"]["message"])
        status, _, response = self.server.get("/v1/nothing")
        self.assertEqual(status, 404)
        self.assertIn("/v1/nothing", response["error"]["message"])
        # Over the body limit (32 MiB): 413 before the body is parsed.
        status, _, response = self.server.post("/v1/completions", b"x" * (33 << 20), raw=True)
        self.assertEqual(status, 413)
        self.assertEqual(response["error"]["code"], "request_too_large")
        self.assert_serving()

    def test_a_client_that_leaves_mid_stream_frees_its_sequence(self):
        body = json.dumps({"prompt": PROMPTS[2], "max_tokens": 900, "ignore_eos": True, "temperature": 0,
                           "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", self.server.port)) as client:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            received = b""
            while received.count(b"data: ") < 5:
                received += client.recv(4096)
            self.assertEqual(self.server.metric("slimkv:num_requests_running"), 1)
        deadline = time.time() + 20
        while self.server.metric("slimkv:num_requests_running") != 0 and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.server.metric("slimkv:num_requests_running"), 0)
        self.assertEqual(self.server.metric("slimkv:kv_cache_usage_perc"), 0)
        status, _, metrics = self.server.get("/metrics")
        self.assertIn('slimkv:request_success_total{model_name="slimkv-llama-15m",finished_reason="abort"}',
                      metrics.decode())
        self.assert_serving()

    def test_a_client_that_leaves_a_whole_answer_frees_its_sequence(self):
        # stream false: nothing is written before the end, yet the server notices the client's close and
        # cancels (finish reason abort, not length), freeing the KV long before 900 tokens would be out.
        self.assertTrue(wait_until(lambda: self.server.metric("slimkv:num_requests_running") +
                                   self.server.metric("slimkv:num_requests_waiting") == 0))
        before, generated = aborted(self.server), self.server.metric("slimkv:generation_tokens_total")
        body = {"prompt": PROMPTS[4], "max_tokens": 900, "ignore_eos": True, "temperature": 0}
        with post_and_leave(self.server, body):
            self.assertTrue(wait_until(lambda: self.server.metric("slimkv:num_requests_running") == 1))
        self.assertTrue(wait_until(lambda: aborted(self.server) == before + 1))
        self.assertTrue(wait_until(lambda: self.server.metric("slimkv:num_requests_running") == 0))
        self.assertTrue(wait_until(lambda: self.server.metric("slimkv:kv_cache_usage_perc") == 0))
        # Freed well before its end: it generated a fraction of its 900 tokens (the watch polls every 100 ms).
        self.assertLess(self.server.metric("slimkv:generation_tokens_total") - generated, 450)
        self.assert_serving()

    def test_a_client_that_leaves_a_queued_request_frees_its_place_and_others_run_on(self):
        # One sequence at a time: A runs, B (stream false) waits behind it, and B's client leaves while B
        # is queued. B ends (abort, nothing waiting) without ever running (A, 500 tokens, takes far longer
        # than the 100 ms watch), and A's answer is the one it gives alone.
        a = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 500, "ignore_eos": True, "temperature": 0}
        with Server(SLIMKV, MODEL, ["--max-num-seqs", "1", "--max-model-len", "1024"]) as server:
            answers = []
            runner = threading.Thread(target=lambda: answers.append(server.post("/v1/completions", a)))
            runner.start()
            try:
                self.assertTrue(wait_until(lambda: server.metric("slimkv:num_requests_running") == 1))
                with post_and_leave(server, dict(a, prompt=PROMPTS[1])):
                    self.assertTrue(wait_until(lambda: server.metric("slimkv:num_requests_waiting") == 1))
                self.assertTrue(wait_until(lambda: aborted(server) == 1))
                self.assertEqual(server.metric("slimkv:num_requests_waiting"), 0)
            finally:
                runner.join(timeout=120)
            self.assertEqual(answers[0][0], 200, answers)
            self.assertEqual(answers[0][2]["usage"]["completion_tokens"], 500)
            alone = completion(server, a["prompt"], max_tokens=500, ignore_eos=True)
            self.assertEqual(answers[0][2]["choices"][0]["text"], alone["choices"][0]["text"])
            self.assertTrue(wait_until(lambda: server.metric("slimkv:generation_tokens_total") == 1000))
            # B never ran: no prompt of its was prefilled, no token of its generated.
            self.assertEqual(server.metric("slimkv:prompt_tokens_total"), 2 * alone["usage"]["prompt_tokens"])
            self.assertEqual(server.metric("slimkv:num_requests_running"), 0)
            self.assertEqual(server.metric("slimkv:kv_cache_usage_perc"), 0)

    def test_metrics_count_tokens(self):
        # Another test's request (a client that left) may still take its last step: count from an idle server.
        deadline = time.time() + 10
        while (self.server.metric("slimkv:num_requests_running") + self.server.metric("slimkv:num_requests_waiting") != 0
               and time.time() < deadline):
            time.sleep(0.05)
        before = self.server.metric("slimkv:generation_tokens_total")
        while time.time() < deadline:  # and whose counters the scheduler has published (it does so after a step)
            time.sleep(0.2)
            now = self.server.metric("slimkv:generation_tokens_total")
            if now == before:
                break
            before = now
        completion(self.server, PROMPTS[3], max_tokens=5)
        # The scheduler publishes its counters after the step that finished the request, which may come
        # after the response: wait for them (bounded).
        deadline = time.time() + 10
        while self.server.metric("slimkv:generation_tokens_total") != before + 5 and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.server.metric("slimkv:generation_tokens_total"), before + 5)
        self.assertGreater(self.server.metric("slimkv:prompt_tokens_total"), 0)
        self.assertGreater(self.server.metric("slimkv:kv_cache_bytes_per_token"), 0)
        _, headers, text = self.server.get("/metrics")
        self.assertTrue(headers["Content-Type"].startswith("text/plain"))
        for name in ["num_requests_waiting", "num_preemptions_total", "time_to_first_token_seconds_bucket",
                     "inter_token_latency_seconds_sum", "e2e_request_latency_seconds_count", "kv_cache_info",
                     "engine_step_seconds_count", "scheduler_between_steps_seconds_sum"]:
            self.assertIn("slimkv:" + name, text.decode())
        # The request's steps were timed: a prefill step and four decode steps of one sequence at least.
        self.assertGreaterEqual(self.server.metric("slimkv:engine_step_seconds_count"), 5)
        self.assertIn('slimkv:decode_step_seconds_count{model_name="slimkv-llama-15m",sequences="1"}', text.decode())


def model_with_chat_template(folder):
    """The bundled model's files, linked, beside a ChatML chat_template.jinja (it has no template)."""
    for name in os.listdir(MODEL):
        os.symlink(os.path.join(MODEL, name), os.path.join(folder, name))
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "chatml_template.jinja")) as f:
        template = f.read()
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write(template)
    return folder


class ChatTest(unittest.TestCase):
    def test_chat_renders_the_models_template(self):
        messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Tell me a story"}]
        rendered = ("<|im_start|>system\nYou are brief.<|im_end|>\n<|im_start|>user\nTell me a story<|im_end|>\n"
                    "<|im_start|>assistant\n")
        with tempfile.TemporaryDirectory() as folder, Server(SLIMKV, model_with_chat_template(folder),
                                                             ["--served-model-name", NAME]) as server:
            status, _, by_messages = server.post("/tokenize", {"messages": messages})
            self.assertEqual(status, 200, by_messages)
            _, _, by_text = server.post("/tokenize", {"prompt": rendered, "add_special_tokens": False})
            self.assertEqual(by_messages["tokens"], by_text["tokens"])

            status, _, chat = server.post("/v1/chat/completions", {"messages": messages, "max_completion_tokens": 12,
                                                                   "temperature": 0})
            self.assertEqual(status, 200, chat)
            self.assertEqual(chat["object"], "chat.completion")
            self.assertEqual(chat["choices"][0]["message"]["role"], "assistant")
            plain = completion(server, by_messages["tokens"], max_tokens=12)
            self.assertEqual(chat["choices"][0]["message"]["content"], plain["choices"][0]["text"])
            self.assertEqual(chat["usage"]["prompt_tokens"], by_messages["count"])

            status, events = server.stream("/v1/chat/completions", {"messages": messages, "max_completion_tokens": 12,
                                                                    "temperature": 0, "stream": True})
            self.assertEqual(status, 200)
            self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
            self.assertEqual(events[0]["object"], "chat.completion.chunk")
            text, finish = stream_text(events)
            self.assertEqual(text, chat["choices"][0]["message"]["content"])
            self.assertEqual(finish, chat["choices"][0]["finish_reason"])


class AuthAndShutdownTest(unittest.TestCase):
    def test_api_key(self):
        with Server(SLIMKV, MODEL, ["--api-key", "sk-test", "--served-model-name", "tiny"]) as server:
            body = {"prompt": "Hi", "max_tokens": 2}
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sk-test"}):
                status, _, response = server.post("/v1/completions", body, headers)
                self.assertEqual(status, 401, headers)
                self.assertEqual(response["error"]["type"], "authentication_error")
            self.assertEqual(server.get("/v1/models")[0], 401)
            self.assertEqual(server.get("/health")[0], 200)  # not under /v1/
            status, _, response = server.post("/v1/completions", body, {"Authorization": "Bearer sk-test"})
            self.assertEqual(status, 200, response)
            self.assertEqual(response["model"], "tiny")

    def test_sigterm_finishes_an_open_stream_and_exits_0(self):
        with Server(SLIMKV, MODEL) as server:
            result = {}

            def run():
                result["status"], result["events"] = server.stream("/v1/completions", {
                    "prompt": "A long story", "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True})
            client = threading.Thread(target=run)
            client.start()
            while server.metric("slimkv:num_requests_running") == 0:
                time.sleep(0.01)
            self.assertEqual(server.stop(), 0, server.output())
            client.join()
            self.assertEqual(result["status"], 200)
            self.assertEqual(result["events"][-1], "[DONE]")
            text, finish = stream_text(result["events"])
            self.assertEqual(finish, "length")
            self.assertIn("SIGTERM", server.output())


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
