#!/bin/bash
# session 16, last call (~140 s of budget): the executor's graph key (signature + last + first) under the other tails'
# and the core's GPU tests. Predicted: all pass (no other tail declares its steps one at a time).
cd "$(dirname "$0")/../../.."
source docs/bench/s6/device_stock_env.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_core_gpu.py tests/test_mimi_gpu.py \
  tests/test_nemotron_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "exit $?" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED" $OUT/gpu-tests.txt | cut -c1-300 | tail -12
