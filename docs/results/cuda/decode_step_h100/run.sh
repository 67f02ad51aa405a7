# Run on the GPU machine from the repository root, with bench_decode_e2e_cuda of 5a3c1a5 copied to
# build/release/bench_decode_e2e_cuda_base and 9b6bfcb's binaries (bench_decode_e2e_cuda, libslimkv_step_trace.so) in build/release.
# call F: decode step before (5a3c1a5) / after (the merge + RMSNorm commits), alternating in one call; traces
set -uo pipefail
OUT=${OUT:-.}  # where the results go
B=build/release
for round in 1 2; do
  for side in base new; do
    bin=$B/bench_decode_e2e_cuda; [ $side = base ] && bin=$B/bench_decode_e2e_cuda_base
    echo "== round $round $side"
    timeout 150 $bin --random llama3-8b --kvs dense,hack --bits 2 --batches 1,2,3,5 --context 16384 2>&1 | grep -v "^#" | tee -a $OUT/e2e_16k_$side.txt
  done
done
for side in base new; do
  bin=$B/bench_decode_e2e_cuda; [ $side = base ] && bin=$B/bench_decode_e2e_cuda_base
  timeout 100 $bin --random llama3-8b --kvs dense --batches 1,4,16 --prompt 512 2>&1 | grep -v "^#" | tee $OUT/e2e_512_$side.txt
done
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
for side in base new; do for kv in dense hack; do
  bin=$B/bench_decode_e2e_cuda; [ $side = base ] && bin=$B/bench_decode_e2e_cuda_base
  SLIMKV_TRACE_OUT=$OUT/trace_${kv}_b1_$side.csv LD_PRELOAD=$PWD/$B/libslimkv_step_trace.so timeout 120 $bin --random llama3-8b --kvs $kv --bits 2 --batches 1 --context 16384 --steps 24 > /dev/null 2>&1
  python3 bench/cuda/step_trace_summary.py $OUT/trace_${kv}_b1_$side.csv 16 > $OUT/trace_${kv}_b1_$side.txt; echo "== trace $kv $side"; head -14 $OUT/trace_${kv}_b1_$side.txt
  rm -f $OUT/trace_${kv}_b1_$side.csv
done; done
