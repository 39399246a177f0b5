#!/bin/bash
# session 17, third call: the bit proofs under the new defaults. The tiny session against MiniCPM-o-Demo's own loop
# with the toggles flipped (now preparing the TTS ahead and, on CUDA, the front end on one thread where proven), and
# the other tails' whole-second graph tests under session 16's graph key (call 4 of session 16: 6 failed on
# capture counts; fixed in d86b037, not run since).
# Predicted: all pass.
cd "$(dirname "$0")/../../.."
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py -k flipped \
  > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_core_gpu.py tests/test_mimi_gpu.py \
  tests/test_nemotron_gpu.py >> $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED|SKIPPED" $OUT/gpu-tests.txt | cut -c1-300 | tail -24
