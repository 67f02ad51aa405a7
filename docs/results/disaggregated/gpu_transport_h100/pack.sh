#!/usr/bin/env bash
# Packs what the device calls need (the call ships main's checkout, not this branch): stripped binaries,
# the shared libraries they load, this branch's test scripts; then copies the folder into /work/main.
set -euo pipefail
wt=$(cd "$(dirname "$0")/.." && pwd); w=$wt/.gpurun-gpu-transport; b=$wt/build/release
stage=$(mktemp -d); mkdir -p "$stage/bin" "$stage/lib" "$stage/scripts"
for exe in slimkv slimkv_cuda_tests bench_kv_transport_cuda; do strip -o "$stage/bin/$exe" "$b/$exe"; done
ldd "$b/slimkv" "$b/slimkv_cuda_tests" | awk '/=> \//{print $3}' | sort -u \
  | grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcublas|libcublasLt|libssl|libcrypto|libz)\.so' | xargs -I{} cp -L {} "$stage/lib/"
cp "$wt/tests/serve/disaggregated_test.py" "$wt/tests/serve/slimkv_server.py" "$stage/scripts/"
(cd "$stage" && tar -cf - bin lib scripts | xz -T1 -9e --lzma2=dict=64MiB > "$w/gpurun.tar.xz")  # one dictionary over the three binaries: they share slimkv_core
git -C "$wt" log -1 --format='branch gpu-transport at %h (%cI)' > "$w/commit.txt"
rm -rf "$stage"
rm -rf /work/main/.gpurun-gpu-transport && cp -r "$w" /work/main/.gpurun-gpu-transport
du -sh "$w/gpurun.tar.xz"
