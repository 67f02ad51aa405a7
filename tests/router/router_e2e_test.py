"""slimkv router in front of real workers: `slimkv serve --role prefill` and two `--role decode` on the
bundled model, each its own process on loopback. Greedy outputs through the router equal a `--role both`
server's (completions and chat, whole and streamed, stop strings), through Python's http.client, curl
and the `openai` npm SDK (tests/serve/openai_sdk_test.mjs, unchanged, pointed at the router); a decode
worker killed (SIGKILL) mid-generation and the client's response is still complete and identical.
Skipped (exit 77) while `slimkv serve` has no --role (the worker side of issue 23 not merged).
Usage: router_e2e_test.py SLIMKV_BINARY SOURCE_DIR NPM_FOLDER"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serve"))
from slimkv_server import Process, Server, stream_text  # noqa: E402

SLIMKV, SOURCE, NPM_FOLDER = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
NAME = "slimkv-llama-15m"
KEY = {"Authorization": "Bearer sk-node"}  # the key openai_sdk_test.mjs uses
PROMPTS = ["The history of the city", "Once upon a time, there was a little", "In mathematics, a prime number"]
MESSAGES = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Tell me a story"}]
# Under ASan (ctest sets SLIMKV_SANITIZED) the 2-bit spec alone, the one whose quantized blocks cross the
# wire: dense disaggregated serving runs under ASan in tests/serve/disaggregated_test.py, and both specs
# run here in the release build.
SPECS = ("hack:bits=2,pi=64",) if os.environ.get("SLIMKV_SANITIZED") else ("dense", "hack:bits=2,pi=64")


def model_with_chat_template(folder):
    """The bundled model's files beside a ChatML template (it has none), served as NAME."""
    model = os.path.join(folder, NAME)
    os.mkdir(model)
    source_model = os.path.join(SOURCE, "models", NAME)
    for name in os.listdir(source_model):
        os.symlink(os.path.join(source_model, name), os.path.join(model, name))
    shutil.copy(os.path.join(SOURCE, "tests", "serve", "chatml_template.jinja"), os.path.join(model, "chat_template.jinja"))
    return model


def text_of(response, chat):
    choice = response["choices"][0]
    return choice["message"]["content"] if chat else choice["text"]


class Deployment:
    """A `--role both` reference server, and one prefill + two decode workers behind a router."""

    def __init__(self, model, kv_spec):
        common = ["--kv", kv_spec, "--max-model-len", "1024"]
        self.reference = Server(SLIMKV, model, common).__enter__()
        self.prefill = Server(SLIMKV, model, common + ["--role", "prefill"]).__enter__()
        self.decode = [Server(SLIMKV, model, common + ["--role", "decode", "--kv-port", "0"]).__enter__() for _ in range(2)]
        command = [SLIMKV, "router", "--port", "0", "--api-key", "sk-node", "--prefill", self.prefill.url,
                   "--decode", ",".join(d.url for d in self.decode), "--health-interval-s", "0.2"]
        self.router = Process(command, name="slimkv-router").__enter__()

    def close(self):
        self.router.stop()
        self.router.__exit__(None, None, None)
        for server in [self.reference, self.prefill] + self.decode:
            if server.process.poll() is None:
                server.stop()
            server.__exit__(None, None, None)

    def logs(self):
        return "\n".join(f"--- {s.name} {s.url}:\n{s.output()[-3000:]}"
                         for s in [self.router, self.prefill] + self.decode)


class RouterEndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp(prefix="slimkv-router-e2e-")
        cls.model = model_with_chat_template(cls.folder)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.folder)

    def ask(self, server, path, body, headers=None):
        status, _, response = server.post(path, body, headers=headers)
        self.assertEqual(status, 200, response)
        return response

    def on_each_spec(self, check):
        """Runs check(deployment) on a fresh deployment of each KV spec."""
        for kv_spec in SPECS:
            deployment = Deployment(self.model, kv_spec)
            try:
                with self.subTest(kv=kv_spec):
                    check(deployment)
            finally:
                deployment.close()

    def test_greedy_outputs_equal_colocated(self):
        self.on_each_spec(self.check_equal_outputs)

    def check_equal_outputs(self, deployment):
        router, reference = deployment.router, deployment.reference
        for prompt in PROMPTS:
            body = {"model": NAME, "prompt": prompt, "max_tokens": 24, "temperature": 0}
            expected = self.ask(reference, "/v1/completions", body)
            got = self.ask(router, "/v1/completions", body, KEY)
            self.assertEqual(text_of(got, False), text_of(expected, False), deployment.logs())
            self.assertEqual(got["usage"], expected["usage"])
            status, events = router.stream("/v1/completions", dict(body, stream=True), KEY)
            self.assertEqual((status, stream_text(events)), (200, (text_of(expected, False), "length")))
        # A stop string cuts exactly where the colocated server cuts.
        body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0}
        stop = text_of(self.ask(reference, "/v1/completions", body), False)[5:9]
        body["stop"] = [stop]
        self.assertEqual(self.ask(router, "/v1/completions", body, KEY)["choices"],
                         self.ask(reference, "/v1/completions", body)["choices"])
        # Chat, whole and streamed.
        body = {"model": NAME, "messages": MESSAGES, "max_completion_tokens": 16, "temperature": 0}
        expected = text_of(self.ask(reference, "/v1/chat/completions", body), True)
        self.assertEqual(text_of(self.ask(router, "/v1/chat/completions", body, KEY), True), expected)
        status, events = router.stream("/v1/chat/completions", dict(body, stream=True), KEY)
        self.assertEqual((status, stream_text(events)[0]), (200, expected))
        # A request the prefill worker refuses: serve's error, unchanged.
        body = {"model": NAME, "prompt": "x" * 5000, "max_tokens": 4}
        status, _, got = router.post("/v1/completions", body, KEY)
        expected_status, _, expected = reference.post("/v1/completions", body)
        self.assertEqual((status, got), (expected_status, expected))
        self.assertEqual(status, 400)
        # curl, as the docs show it.
        body = '{"model": "%s", "prompt": "%s", "max_tokens": 12, "temperature": 0}' % (NAME, PROMPTS[1])
        curl = subprocess.run(["curl", "-sf", f"{router.url}/v1/completions", "-H", "Content-Type: application/json",
                               "-H", "Authorization: " + KEY["Authorization"], "-d", body],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(curl.returncode, 0, curl.stderr)
        expected = self.ask(reference, "/v1/completions", json.loads(body))
        self.assertEqual(text_of(json.loads(curl.stdout), False), text_of(expected, False))
        # The openai npm SDK: serve's own SDK test, pointed at the router.
        sdk = subprocess.run([os.path.join(SOURCE, "tests", "serve", "openai_sdk_test.sh"), SLIMKV, SOURCE, NPM_FOLDER,
                              f"{router.url}/v1"], capture_output=True, text=True, timeout=300)
        if sdk.returncode == 77:
            print("note: the openai SDK part was skipped:", sdk.stdout.strip())
        else:
            self.assertEqual(sdk.returncode, 0, sdk.stdout + sdk.stderr + deployment.logs())

    def test_decode_worker_killed_mid_generation(self):
        # The new decode worker's KV of the tokens already generated comes from the prefill worker running
        # them as forced decode steps, bit for bit what decoding left, so the response is identical for
        # 2-bit KV too (a prefill of them was not: greedy tokens differed ~55 tokens later).
        self.on_each_spec(self.kill_mid_generation)

    def kill_mid_generation(self, deployment):
        body = {"model": NAME, "prompt": PROMPTS[1], "max_tokens": 160, "temperature": 0, "ignore_eos": True}
        expected = text_of(self.ask(deployment.reference, "/v1/completions", body), False)
        connection = deployment.router.connection()
        connection.request("POST", "/v1/completions",
                           body=json.dumps(dict(body, stream=True, stream_options={"include_usage": True})),
                           headers=dict(KEY, **{"Content-Type": "application/json"}))
        response = connection.getresponse()
        self.assertEqual(response.status, 200)
        events, killed, text_at_kill = [], None, None
        for line in response:
            line = line.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
            if killed is None and len(events) == 10:
                # The decode worker generating it (running 1 on its /health) dies at once.
                busy = [d for d in deployment.decode if d.get("/health")[2].get("running", 0) > 0]
                self.assertEqual(len(busy), 1, [d.get("/health")[2] for d in deployment.decode])
                killed = busy[0]
                killed.kill()
                text_at_kill = stream_text(events)[0]
        connection.close()
        self.assertIsNotNone(killed)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2]["usage"]["completion_tokens"], 160, "the whole request counted")
        text, finish = stream_text(events)
        self.assertEqual(finish, "length")
        self.assertTrue(expected.startswith(text_at_kill))
        self.assertEqual(text, expected, deployment.logs())
        status, _, metrics = deployment.router.get("/metrics")
        self.assertIn('slimkv_router:retries_total{role="decode"} 1', metrics.decode())
        # The survivor serves the next request alone.
        self.assertEqual(text_of(self.ask(deployment.router, "/v1/completions", body, KEY), False), expected)

if __name__ == "__main__":
    done = subprocess.run([SLIMKV, "serve", "--help"], capture_output=True, text=True, timeout=30)
    if "--role" not in done.stdout:
        print("SKIP: this slimkv serve has no --role yet (the worker side of disaggregated serving)")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
