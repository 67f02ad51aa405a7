"""Where the module finds the CUDA backend (engine/cuda_backend.h): beside the module's own file, wherever it
was installed (pip, cmake --install), not only beside the program (python3). Each case imports a copy of
the module from a fresh folder in a child process and asks for device "cuda"; a build without the CUDA
backend (no nvcc when it was configured) skips."""
import os
import shutil
import subprocess
import sys

import pytest

import slimkv
from conftest import MODEL

PLUGIN = "libslimkv_cuda.so"  # kCudaPluginFile


def open_cuda(folder):
    """'loaded', or the error of Engine(device="cuda") with the module imported from `folder`."""
    env = {key: value for key, value in os.environ.items() if key != "SLIMKV_CUDA_LIBRARY"}
    env["PYTHONPATH"] = str(folder)
    code = f"""
import slimkv
assert slimkv.__file__.startswith({str(folder)!r}), slimkv.__file__
try:
    slimkv.Engine({MODEL!r}, device="cuda", threads=1)
    print("loaded")
except slimkv.Error as error:
    print(error)
"""
    # In `folder`: the module's run path has an empty entry (the current directory) when built, and a
    # build folder holds a plugin that the dynamic loader's search would find there.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=folder,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    if "this build has no CUDA backend" in message:
        pytest.skip(message)
    return message


def test_the_plugin_is_looked_for_beside_the_module(tmp_path):
    shutil.copy(slimkv.__file__, tmp_path)  # the module alone
    message = open_cuda(tmp_path)
    if message == "loaded":
        pytest.skip("a plugin was found elsewhere (the dynamic loader's search)")
    assert f"{tmp_path}/{PLUGIN}: no such file" in message


def test_a_plugin_beside_the_module_is_opened(tmp_path):
    plugin = os.path.join(os.path.dirname(slimkv.__file__), PLUGIN)
    if not os.path.exists(plugin):
        pytest.skip(f"this build made no CUDA plugin ({plugin})")
    shutil.copy(slimkv.__file__, tmp_path)
    shutil.copy(plugin, tmp_path)
    message = open_cuda(tmp_path)
    # Loaded, or refused by the plugin itself (no GPU or driver here), never "could not be loaded".
    assert message == "loaded" or "could not be loaded" not in message, message
    assert "another slimkv build" not in message, message
