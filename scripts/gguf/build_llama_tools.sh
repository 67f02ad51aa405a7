#!/bin/bash
# Builds what scripts/gguf/make_fixtures.py and bench/gguf_speed.sh need from a llama.cpp source tree
# (CPU only, static): llama_ref against its libllama, and llama-bench.
#   LLAMA_SRC=<llama.cpp tree> OUT=<folder> scripts/gguf/build_llama_tools.sh
# AVX-512 is named rather than -march=native: llama.cpp's AMX weight repacking can die with SIGILL
# on VMs that advertise AMX.
set -eu
LLAMA_SRC=${LLAMA_SRC:?llama.cpp source tree}
OUT=${OUT:?where the tools go}
HERE=$(cd "$(dirname "$0")" && pwd)
B=$LLAMA_SRC/build
cmake -S "$LLAMA_SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_CUDA=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$B" -j2 --target llama
mkdir -p "$OUT"
g++ -O2 -std=c++17 -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" "$HERE/llama_ref.cpp" -o "$OUT/llama_ref" \
  "$B/src/libllama.a" "$B/ggml/src/libggml.a" "$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a" \
  -fopenmp -lpthread -ldl -lm
cmake --build "$B" -j2 --target llama-bench && cp "$B/bin/llama-bench" "$OUT/"
echo "built: $OUT/llama_ref $OUT/llama-bench"
