"""Starts `slimkv serve` (or another server: the router, a test's fake worker) on a free loopback port for
a test and stops it; small HTTP helpers on http.client. Used by tests/serve/*.py, tests/router/*.py and
scripts/serve_load_test.py (Debian's python3 only)."""
import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import time


class Process:
    """A server process for a test: `command` must print "listening on http://HOST:PORT" (it binds port 0,
    so the kernel picks a free one: no race with other tests); ready once GET `health_path` answers 200.
    `with Process([...]) as server:` runs it for the block; the HTTP helpers below talk to it."""

    def __init__(self, command, host="127.0.0.1", ready_timeout_s=120, health_path="/health", name=None, env=None):
        self.command, self.host, self.health_path = list(command), host, health_path
        self.env = None if env is None else dict(os.environ, **env)  # variables set for this process only
        self.name = name or os.path.basename(self.command[0])
        self.ready_timeout_s = ready_timeout_s
        self.process = None
        self.port = None
        self.exit_code = None

    def __enter__(self):
        self.log = tempfile.NamedTemporaryFile(prefix=f"{self.name}-", suffix=".log", delete=False)
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.time() + self.ready_timeout_s
        while self.port is None:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.output()}")
            if time.time() > deadline:
                raise RuntimeError(f"{self.name} did not print its port:\n{self.output()}")
            match = re.search(r"listening on http://\S+?:(\d+)", self.output())
            if match:
                self.port = int(match.group(1))
            time.sleep(0.05)
        while self.health_path and self.get(self.health_path)[0] != 200:  # 503 while the engine loads
            if self.process.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{self.name} never became healthy:\n{self.output()}")
            time.sleep(0.1)
        return self

    @property
    def url(self):
        return f"http://{self.host}:{self.port}"

    def kill(self):
        """SIGKILL: the process dies at once, its connections reset (a crashed worker)."""
        self.process.kill()
        self.exit_code = self.process.wait(timeout=30)


    def restart(self):
        """Runs the command again on the port it had (a crashed worker brought back where its clients,
        such as the router, expect it); the process must have ended."""
        assert self.process.poll() is not None, "restart() of a running process"
        at = self.command.index("--port")
        self.command[at + 1] = str(self.port)
        os.unlink(self.log.name)
        self.port = None
        return self.__enter__()

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.stop()
        os.unlink(self.log.name)

    def stop(self, timeout_s=60):
        """SIGTERM, then the exit code (the server drains first)."""
        self.process.send_signal(signal.SIGTERM)
        self.exit_code = self.process.wait(timeout=timeout_s)
        return self.exit_code

    def output(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def connection(self, timeout_s=120):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)

    def request(self, method, path, body=None, headers=None, raw=False):
        """Returns (status, headers dict, body bytes or parsed JSON)."""
        connection = self.connection()
        try:
            data = body if (raw or body is None) else json.dumps(body)
            all_headers = {"Content-Type": "application/json"}
            all_headers.update(headers or {})
            connection.request(method, path, body=data, headers=all_headers)
            response = connection.getresponse()
            payload = response.read()
            if "application/json" in response.getheader("Content-Type", ""):
                payload = json.loads(payload)
            return response.status, dict(response.getheaders()), payload
        finally:
            connection.close()

    def get(self, path, headers=None):
        try:
            return self.request("GET", path, headers=headers)
        except (ConnectionError, OSError):
            return 0, {}, b""

    def post(self, path, body, headers=None, raw=False):
        return self.request("POST", path, body, headers, raw)

    def stream(self, path, body, headers=None):
        """POSTs a streaming request; returns (status, [event payloads as parsed JSON or "[DONE]"])."""
        connection = self.connection()
        try:
            all_headers = {"Content-Type": "application/json"}
            all_headers.update(headers or {})
            connection.request("POST", path, body=json.dumps(body), headers=all_headers)
            response = connection.getresponse()
            if response.status != 200:
                return response.status, [json.loads(response.read())]
            events = []
            for line in response:  # http.client undoes the chunked encoding
                line = line.decode().rstrip("\n")
                if not line.startswith("data: "):
                    continue  # blank separators and ": comment" keep-alives
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
            return response.status, events
        finally:
            connection.close()

    def metric(self, name):
        """The value of an unlabelled-but-for-model_name sample of /metrics."""
        status, _, text = self.get("/metrics")
        assert status == 200, status
        for line in text.decode().splitlines():
            if line.startswith(name + "{") and "le=" not in line:
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


    def metric_sample(self, sample):
        """The value of the /metrics line that starts with `sample` (a name and its labels, as printed)."""
        status, _, text = self.get("/metrics")
        assert status == 200, status
        for line in text.decode().splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(sample)


class Server(Process):
    """`with Server(slimkv, model, ["--kv", "dense"]) as server:` runs one `slimkv serve` for the block."""

    def __init__(self, slimkv, model, args=(), host="127.0.0.1", ready_timeout_s=120, env=None):
        self.slimkv, self.model, self.args = slimkv, model, list(args)
        super().__init__([slimkv, "serve", "--model", model, "--host", host, "--port", "0", "--threads", "2"] + self.args,
                         host=host, ready_timeout_s=ready_timeout_s, name="slimkv-serve", env=env)


def stream_text(events):
    """The text of a completions or chat stream, and its last choice's finish_reason."""
    text, finish = "", None
    for event in events:
        if event == "[DONE]" or not event.get("choices"):
            continue
        choice = event["choices"][0]
        text += choice.get("text") or choice.get("delta", {}).get("content") or ""
        finish = choice.get("finish_reason") or finish
    return text, finish
