#!/usr/bin/env bash
# Staged KV streams laid out at HELLO against staged from the head (issue 23): the 8B KV shape at 4096 tokens,
# each layer's sealed blocks sent first as KV_BLOCKS (as a GPU prefill step or a chunked prompt hands them out),
# uncapped and at 10 Gbit/s; one run of each on the 2-core dev VM (Intel Xeon), from the repository root.
for g in 0 10; do
  build/release/bench_kv_host_path --specs "dense:dtype=f16;hack:bits=2,pi=64" --prompt-tokens 4096 --form blocks \
    --variants overlapped,pipelined,laid-out --repeats 3 --gbps $g > "$(dirname "$0")/blocks_gbps$g.txt"
done
