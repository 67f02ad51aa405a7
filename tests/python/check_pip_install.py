#!/usr/bin/env python3
"""`pip install .` as docs/python.md gives it, offline: Debian's pip, setuptools and wheel
(--no-build-isolation, --no-index) in a venv made with --system-site-packages (Debian's NumPy), the module
built by the project's CMake build — here this build's folder, reused (nothing rebuilt when it is
current). The venv then imports the installed module (not the build tree's), runs the bundled model, opens
the CUDA plugin installed beside it (a build with the CUDA backend), and pip uninstalls it.

    check_pip_install.py SOURCE_DIR BUILD_DIR        (ctest: python_pip_install)
"""
import os
import subprocess
import sys
import tempfile

TIMEOUT_S = 300  # the install reuses a built module: seconds, unless the build folder is stale


def run(*args, env=None, cwd=None):
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=TIMEOUT_S)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def main():
    source_dir, build_dir = map(os.path.abspath, sys.argv[1:3])
    model = os.path.join(source_dir, "models", "slimkv-llama-15m")
    plugin = os.path.join(build_dir, "python", "libslimkv_cuda.so")  # built beside the module (cmake/cuda.cmake)
    with tempfile.TemporaryDirectory(prefix="slimkv-pip-") as work:
        venv = os.path.join(work, "venv")
        # --without-pip: the venv runs Debian's pip from the system site-packages, installing into the venv.
        run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv)
        python = os.path.join(venv, "bin", "python")
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "SLIMKV_CUDA_LIBRARY")}
        env["SLIMKV_CMAKE_BUILD_DIR"] = build_dir
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        run(python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir", source_dir,
            env=env, cwd=work)
        check = f"""
import os, sys, slimkv
assert os.path.realpath(slimkv.__file__).startswith(os.path.realpath(sys.prefix)), slimkv.__file__
engine = slimkv.Engine({model!r}, threads=1)
[out] = engine.generate("Once upon a time", max_tokens=4)
assert out.finish_reason in ("stop", "length") and 0 < len(out.token_ids) <= 4, out
print(slimkv.__version__, slimkv.__file__)
# A build with the CUDA backend ships its plugin beside the module, and the module finds it there: loaded,
# or refused by the plugin itself (no GPU here), never "could not be loaded" (not found, or its libcublas not).
if os.path.exists({plugin!r}):
    assert os.path.exists(os.path.join(os.path.dirname(slimkv.__file__), "libslimkv_cuda.so")), "no plugin installed"
    try:
        slimkv.Engine({model!r}, device="cuda", threads=1)
    except slimkv.Error as error:
        assert "could not be loaded" not in str(error) and "another slimkv build" not in str(error), error
    print("the CUDA plugin installed beside the module, and found there")
"""
        print(run(python, "-c", check, env=env, cwd=work), end="")
        listed = run(python, "-m", "pip", "show", "--files", "slimkv", env=env, cwd=work)
        assert "Version: " in listed and ".so" in listed, listed
        run(python, "-m", "pip", "uninstall", "--yes", "slimkv", env=env, cwd=work)
        gone = subprocess.run([python, "-c", "import slimkv"], capture_output=True, text=True, env=env, cwd=work)
        assert gone.returncode != 0 and "No module named 'slimkv'" in gone.stderr, gone.stderr
    print("pip install, import, generate, uninstall: ok")


if __name__ == "__main__":
    main()
