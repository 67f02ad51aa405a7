"""`pip install .`: the slimkv module as the project's CMake build makes it (target slimkv_python), put
where setuptools packs it. No build logic of its own: docs/python.md.

    pip install --no-build-isolation .                                    # configures build/pip-<python>
    SLIMKV_CMAKE_BUILD_DIR=build/release pip install --no-build-isolation .  # reuses a configured build
CMAKE_ARGS (e.g. "-DSLIMKV_CUDA=OFF") adds options to a new build folder's configure.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# setuptools' own files (its build/ and egg-info) go under the CMake build folder, not the source tree.
SETUPTOOLS_DIR = os.path.join("build", "setuptools")
CUDA_PLUGIN = "libslimkv_cuda.so"  # kCudaPluginFile (src/engine/cuda_backend.h)


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as cmake_lists:
        return re.search(r"project\(slimkv VERSION ([0-9.]+)", cmake_lists.read()).group(1)


class CMakeBuild(build_ext):
    """Builds the module with CMake for the Python running pip, and copies it to the wheel."""

    def build_extension(self, ext):
        build_dir = os.path.abspath(os.environ.get("SLIMKV_CMAKE_BUILD_DIR") or
                                    os.path.join(ROOT, "build", "pip-" + sys.implementation.cache_tag))
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
                            "-DPython3_EXECUTABLE=" + sys.executable, *shlex.split(os.environ.get("CMAKE_ARGS", ""))],
                           check=True)
        subprocess.run(["cmake", "--build", build_dir, "--target", "slimkv_python", "-j", str(os.cpu_count() or 1)],
                       check=True)
        # The module's file name carries the ABI of the Python it was built for: a reused build folder
        # configured for another Python would install a module this one cannot import.
        built = os.path.join(build_dir, "python", "slimkv" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not os.path.exists(built):
            folder = os.path.dirname(built)
            found = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
            sys.exit(f"{built} was not built: {build_dir} is configured for another Python (it holds "
                     f"{found or 'no module'}) or without pybind11-dev / python3-dev; configure it with "
                     f"-DPython3_EXECUTABLE={sys.executable}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target)
        # A build with the CUDA backend (nvcc found) also made its plugin, which the module opens on
        # device "cuda" from beside itself (engine/cuda_backend.h): it goes in the wheel beside the module.
        plugin = os.path.join(os.path.dirname(built), CUDA_PLUGIN)
        if os.path.exists(plugin):
            shutil.copyfile(plugin, os.path.join(os.path.dirname(target), CUDA_PLUGIN))


os.makedirs(os.path.join(ROOT, SETUPTOOLS_DIR), exist_ok=True)
setup(
    version=project_version(),
    ext_modules=[Extension("slimkv", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": SETUPTOOLS_DIR}, "egg_info": {"egg_base": SETUPTOOLS_DIR}},
)
