# Session 18's call on two H100s (run from the repository root with the release binaries in build/release):
# the whole CUDA suite, --device cuda:1, the 2-GPU disaggregated and fault tests, and the NCCL transport bench.
export SLIMKV_SOURCE_DIR=$PWD NCCL_NVLS_ENABLE=0 OUT=${OUT:-.}
B=build/release
$B/slimkv_cuda_tests > $OUT/all_tests.log 2>&1
$B/slimkv serve --model models/slimkv-llama-15m --device cuda:1 --port 18080 & p=$!; sleep 12
nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv; kill $p
$B/slimkv generate --model models/slimkv-llama-15m --device cuda:2 --prompt hi --max-tokens 2   # refused: 2 GPUs
python3 tests/serve/disaggregated_test.py $B/slimkv . --device cuda --two-gpus
python3 tests/router/router_e2e_test.py $B/slimkv . /tmp/no-npm --device cuda --two-gpus -k killed
$B/bench_kv_transport_cuda --two-gpus --shape llama3-8b --specs "dense:dtype=f16;hack:bits=4;hack:bits=2,pi=64" \
    --prompt-tokens 16384,32768,65536 --transports nccl,nccl@100,nccl@10 --repeats 1 > $OUT/transport_64k.txt
python3 tests/serve/disaggregated_test.py $B/slimkv . --device cuda
python3 tests/serve/disaggregated_test.py $B/slimkv . --device cuda --kv-transport tcp
