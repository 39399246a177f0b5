#!/bin/bash
# session 17, first call: session 16's last change on the GPU (the executor keys first and last steps apart only
# for a model that branches on them), under the whole GPU suite (not run as a whole since session 10).
# Predicted: every test passes; Mimi's and the Nemotron codec's capture counts are session 15's again (session 16's
# last call, before the change: 6 failed, each one capture more than counted, no bit differed).
cd "$(dirname "$0")/../../.."
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 540 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_core_gpu.py tests/test_mimi_gpu.py \
  tests/test_nemotron_gpu.py tests/test_step_audio2_gpu.py tests/test_minicpmo45_gpu.py tests/test_host_gpu.py \
  tests/test_memory_cap_gpu.py tests/test_session_gpu.py tests/test_fastpath_gpu.py tests/test_memory_map.py \
  tests/test_exact_norm_rope_gpu.py tests/test_sync_free_sampling.py tests/test_minicpmo45_codes_ahead.py \
  > $OUT/gpu-suite.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-suite.txt
grep -E "passed|failed|^E |exit|^FAILED|SKIPPED" $OUT/gpu-suite.txt | cut -c1-300 | tail -24
