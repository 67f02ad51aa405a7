#!/bin/bash
# Issue 30 at the 8B shape, deeper: pp512 @ d4096 and tg32 @ d8192, 3 rounds alternating llama.cpp and slimkv,
# 2 threads, 2 repetitions of each (slimkv_bench rebuilt against this commit's build/release first:
# peers/llamacpp/build_tools.sh). The same setup and commands as ../rerun_2026-11-28/run.sh.
R=${R:-/tmp/run8b_depth} PP_DEPTH=4096 TG_DEPTH=8192 PP_REPS=2 bash "$(dirname "$0")/../rerun_2026-11-28/run.sh"
