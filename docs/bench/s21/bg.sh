#!/bin/bash
# session 21 (background across calls: `DC_WALL=540 bash .snap/docs/bench/device_bg.sh docs/bench/s21/bg.sh start`,
# then the same without `start` within 30 s of each call's end). Predictions in docs/device-notes-session21.md.
#  1. issue 23's GPU tests on the final code (session 20's HEAD 0d68c25): split-K linears, token2wav == stock,
#     MiniCPM-o graph replay == eager == stock-loop at every stage, the core's capture gate;
#  2. issue 24's GPU tests: whole MiniCPM-o sessions starting and stopping at random seconds, the 22 GiB cap.
cd "$(dirname "$0")/../../.."
R=/tmp/s21; mkdir -p $R; export OUT=$R
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 900 python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=20 tests/test_step_audio2_linears.py \
  tests/test_step_audio2_gpu.py tests/test_minicpmo45_gpu.py tests/test_minicpmo45_stock_loop_gpu.py \
  tests/test_core_gpu.py tests/test_exact_norm_rope_gpu.py > $R/gpu-tests-23.txt 2>&1; stamp "issue 23 GPU tests (exit $?)"
timeout 600 python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=10 tests/test_host_gpu.py \
  tests/test_memory_cap_gpu.py > $R/gpu-tests-24.txt 2>&1; stamp "issue 24 GPU tests (exit $?)"
touch $R/DONE
