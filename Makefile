# slimkv — the two set-up commands on a fresh Debian 12 machine:
#   make run    installs what is missing, builds, and generates text with the bundled model
#   make test   builds and runs every test (release build, then an ASan+UBSan build, then the fuzzers briefly)
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
ASAN := build/asan
FUZZ := build/fuzz
MODEL ?= models/slimkv-llama-14m
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

$(ASAN)/build.ninja:
	cmake -S . -B $(ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSLIMKV_SANITIZE=ON -DSLIMKV_BENCH=OFF $(CMAKE_FLAGS)

test-asan: deps $(ASAN)/build.ninja
	cmake --build $(ASAN) -j $(JOBS)
	cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

$(FUZZ)/build.ninja:
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ) -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" -DSLIMKV_FUZZ=ON -DSLIMKV_SANITIZE=ON -DSLIMKV_BENCH=OFF $(CMAKE_FLAGS)

# Each fuzz target runs briefly from its seed corpus (fuzz/corpus/<name>/); a crash fails the test.
test-fuzz: deps $(FUZZ)/build.ninja
	bash scripts/run_fuzzers.sh $(FUZZ) $(JOBS)

test: test-release test-asan test-fuzz

bench: build
	@ls $(RELEASE)/bench_* 2>/dev/null

clean:
	rm -rf build
