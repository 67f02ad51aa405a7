#!/usr/bin/env bash
# 2-bit HACK decode on INT8 tensor cores beside the dp4a kernel (docs/cuda.md, "2-bit decode on INT8 tensor
# cores"), one H200 (2026-11-28): the quantized tests (bit for bit against dp4a), memcheck and racecheck,
# the kernel by batch, the 16K step by batch, into $OUT. Binaries in build/release.
#   attn_rule_dp4a.txt, e2e_16k_rule_dp4a.txt: the same benches at main 9c0210a (the split rule, dp4a only)
#   attn_merged_in_last_cta.txt: the kernel loop below with a build (61fb838 plus a change not kept) whose last
#     CTA of each tile and KV head merged the splits instead of the merge kernel; GPU 0 of a two-H200 host
set -uo pipefail
B=build/release
$B/slimkv_cuda_tests --gtest_filter='*Quantized*' > "$OUT/tests.txt" 2>&1
for tool in memcheck racecheck; do
  /usr/local/cuda/bin/compute-sanitizer --tool $tool $B/slimkv_cuda_tests --gtest_filter='*OnTensorCoresIsTheDp4a*' > "$OUT/$tool.txt" 2>&1
done
for b in 1 3 5 8; do
  $B/bench_decode_attention_cuda --batch $b --contexts 4096,16384,65536 --repetitions 30 --specs "hack:bits=2,pi=64" \
    --integer-kernels tc,dp4a | tail -7
done > "$OUT/attn_tc_vs_dp4a.txt"
$B/bench_decode_e2e_cuda --random llama3-8b --kvs dense,hack --bits 2 --batches 1,3,5,8 --prompt 16384 --steps 32 > "$OUT/e2e_16k_tc.txt"
