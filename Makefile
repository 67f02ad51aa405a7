# slimkv — the two set-up commands on a fresh Debian 12 machine:
#   make run    installs what is missing, builds, and generates text with the bundled model
#   make test   builds and runs every test (release build, then an ASan+UBSan build, then the fuzzers briefly)
# CI runs `make test` on 2 cores and must stay under ~25 minutes: docs/testing.md says where the time goes.
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
ifeq ($(CI),true)
  CMAKE_FLAGS += -DSLIMKV_WERROR=ON
endif
# The Python module is built for, and tested with, Debian's python3 (its python3-numpy, python3-pytest...),
# not another python3 found first on PATH (pyenv, conda).
PYTHON ?= /usr/bin/python3
ifneq ($(wildcard $(PYTHON)),)
  CMAKE_FLAGS += -DPython3_EXECUTABLE=$(PYTHON)
endif
RELEASE := build/release
# One sanitized build serves the ASan+UBSan tests and the fuzzers (one compile of the library, not two):
# clang (libFuzzer), -O1 for the engine library and -O0 for the rest (CMakeLists.txt says why), line
# tables only (full debug info makes compiles and links slower; reports still name file and line).
# -march=native: Highway then compiles each SIMD kernel for this machine's best target alone, the one
# its runtime dispatch would pick anyway (a release build compiles four: AVX-512 VNNI, AVX-512, AVX2,
# baseline); the sanitized tests run the same kernels for a quarter or less of their compile
# (docs/testing.md, "CI time"). Its binaries run only on a CPU like this one: for fuzz binaries to
# carry elsewhere, configure a fresh build/sanitize with `make test-asan SANITIZE_ARCH=`.
SANITIZE := build/sanitize
SANITIZE_ARCH ?= -march=native
MODEL ?= models/slimkv-llama-15m
# The main job: long-context retrieval — a pass key hidden at 40% depth of ~1900 tokens of filler.
PROMPT_FILE ?= $(MODEL)/passkey_prompt.txt
KV ?= dense

.PHONY: deps build run test test-release test-asan test-fuzz bench clean

deps:
	@bash scripts/install_deps.sh

$(RELEASE)/build.ninja:
	cmake -S . -B $(RELEASE) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(RELEASE)/build.ninja
	cmake --build $(RELEASE) -j $(JOBS)

run: build
	@echo "== slimkv generate --kv $(KV): the model must answer with the pass key hidden in $(PROMPT_FILE)"
	$(RELEASE)/slimkv generate --model $(MODEL) --prompt-file $(PROMPT_FILE) --max-tokens 16 --kv $(KV)

test-release: build
	cd $(RELEASE) && ctest --output-on-failure -j $(JOBS)

$(SANITIZE)/build.ninja:
	CC=clang CXX=clang++ cmake -S . -B $(SANITIZE) -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only $(SANITIZE_ARCH)" -DSLIMKV_SANITIZE=ON -DSLIMKV_FUZZ=ON -DSLIMKV_BENCH=OFF $(CMAKE_FLAGS)

test-asan: deps $(SANITIZE)/build.ninja
	cmake --build $(SANITIZE) -j $(JOBS)
	cd $(SANITIZE) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# Each fuzz target runs briefly (10 s) from its corpus (fuzz/corpus/<name>/: seeds and the inputs of the
# long runs that added coverage), JOBS at a time; a crash fails the test. The long runs (>= 10^6
# executions per target) are recorded in docs/testing.md.
test-fuzz: deps $(SANITIZE)/build.ninja
	bash scripts/run_fuzzers.sh $(SANITIZE) $(JOBS) 10

test: test-release test-asan test-fuzz

bench: build
	@ls $(RELEASE)/bench_* 2>/dev/null

clean:
	rm -rf build
