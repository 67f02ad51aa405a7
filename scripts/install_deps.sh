#!/usr/bin/env bash
# Installs the Debian 12 packages slimkv builds, tests and runs with; installs only what is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  clang                    # libFuzzer targets (clang -fsanitize=fuzzer)
  libopenblas-dev          # BLAS GEMM
  liblapacke-dev           # LAPACK's C interface: ZACK calibration's eigendecomposition (LAPACK from OpenBLAS)
  libhwy-dev               # portable SIMD with runtime dispatch (Highway)
  libpcre2-dev             # pre-tokenizer regex with Unicode properties
  libutf8proc-dev          # Unicode normalization (NFC/NFKC) for tokenizer.json normalizers
  nlohmann-json3-dev       # JSON
  libcli11-dev             # command-line parsing
  libgtest-dev libgmock-dev  # tests
  libbenchmark-dev         # micro-benchmarks
  gnuplot-nox              # slimkv eval's PNG plots
  python3-jsonschema       # tests: results.json checked against docs/eval_results.schema.json
  libfaiss-dev             # bench_pq: the reference product quantizer slimkv's PQ is compared with
  libcpp-httplib-dev       # slimkv serve's HTTP server
  nodejs                   # tests: the openai npm package against slimkv serve (npm: below)
  python3-dev pybind11-dev  # the Python module `slimkv` (src/python/, docs/python.md)
  python3-numpy            # its logits and KV as NumPy arrays
  python3-pytest           # its tests (tests/python/, run by ctest)
  python3-pandas           # slimkv.evaluate's DataFrame (optional: a list of dicts without it)
  python3-matplotlib       # examples/compare_kv.py's plot
  python3-pip python3-setuptools python3-wheel  # `pip install .` of the module, offline (pyproject.toml, setup.py)
  python3                  # scripts/check_layers.py (ctest), tests/eval_cli_test.sh
  python3-jinja2           # scripts/render_chat_fixtures.py (reference chat-template renderings)
  python3-regex            # scripts/train/bpe.py (GPT-2 pre-tokenizer pattern): reference_cpu.py, build_corpus.py
  coreutils                # tests: mkfifo, timeout, mktemp
  python3-yaml             # tests/deploy/k8s_render_test.py reads kubectl kustomize's output
)
# Only for making reference data, not for building or testing (so not installed here; CI stays light):
# apt-get install python3-torch python3-tqdm python3-sentencepiece — PyTorch 1.13 for scripts/train/reference_cpu.py and kv_stats.py
# (the plain FP32 reference) and llama.cpp's converter in scripts/gguf/make_fixtures.py; python3-sentencepiece
# for that script's SentencePiece tokenizers (trained, converted, and their ids as goldens), and
# python3-protobuf for the one whose scores it edits (apt-get install python3-protobuf). Not in Debian 12:
# transformers and tokenizers (scripts/golden/, scripts/train/train.py, bench/cuda/*.py): pip install them.
# kubectl (no Debian 12 package; tests/deploy/k8s_render_test.py is skipped without it) renders deploy/k8s.

# apt on a machine that just booted often finds the dpkg lock held by unattended-upgrades: wait for it
# (up to 10 minutes) instead of failing at once.
apt_wait=(-o DPkg::Lock::Timeout=600)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm: Debian's package, unless a Node.js that bundles its own (NodeSource's) is installed already.
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  # A mirror hiccup fails `apt-get update` now and then: one retry after a pause.
  if ! $sudo apt-get "${apt_wait[@]}" update -qq; then
    echo "install_deps: apt-get update failed; retrying once in 10 s" >&2
    sleep 10
    $sudo apt-get "${apt_wait[@]}" update -qq
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get "${apt_wait[@]}" install -y -qq --no-install-recommends "${missing[@]}"
fi
