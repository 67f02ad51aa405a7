"""Shared fixtures of the Python module's tests (docs/python.md). ctest runs them with PYTHONPATH set to the
build's python/ folder and SLIMKV_CLI to the build's `slimkv` binary; by hand:
    PYTHONPATH=build/release/python SLIMKV_CLI=build/release/slimkv python3 -m pytest tests/python
"""
import json
import os
import subprocess

import pytest

import slimkv

SOURCE_DIR = os.environ.get("SLIMKV_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODEL = os.path.join(SOURCE_DIR, "models", "slimkv-llama-15m")
THREADS = 2  # the tests run beside each other on small machines
with open(os.path.join(MODEL, "config.json")) as config_file:
    CONFIG = json.load(config_file)  # the model's shape, as transformers reads it
CONTEXT = CONFIG["max_position_embeddings"]


@pytest.fixture(scope="session")
def cli():
    """Runs the `slimkv` CLI of the same build; returns its stdout (a failure shows its stderr)."""
    binary = os.environ.get("SLIMKV_CLI", os.path.join(SOURCE_DIR, "build", "release", "slimkv"))
    if not os.path.exists(binary):
        pytest.fail(f"the slimkv CLI is not at {binary}: build it, or set SLIMKV_CLI")

    def run(*args):
        done = subprocess.run([binary, *args], capture_output=True, text=True)
        assert done.returncode == 0, f"slimkv {' '.join(args)} failed: {done.stderr}"
        return done.stdout
    return run


@pytest.fixture(scope="session")
def engine():
    return slimkv.Engine(MODEL, threads=THREADS)


@pytest.fixture(scope="session")
def heldout_ids(engine):
    """Token ids of the model's held-out text (enough for several KV blocks)."""
    with open(os.path.join(MODEL, "heldout.txt")) as text:
        return engine.tokenizer.encode(text.read()[:20000])
