#!/bin/bash
# next session, first call: (1) which TTS module's output differs between a CUDA process's first and second run of
# the same tiny second (session 15's finding); (2) the whole GPU suite, not run as a whole since session 10.
# Predicted: (1) names one module (a GEMM or an attention call on its first launch) or says the modules agree;
# (2) every GPU test passes (the grouped-query attention test skips: the H200's check refused it in session 15).
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
PYTHONPATH=.:tests timeout 60 python3 docs/bench/s16/first_run_diagnostic.py > $OUT/first-run.txt 2>&1
tail -12 $OUT/first-run.txt
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_core_gpu.py tests/test_host_gpu.py \
  tests/test_memory_cap_gpu.py tests/test_minicpmo45_gpu.py tests/test_session_gpu.py tests/test_step_audio2_gpu.py \
  tests/test_fastpath_gpu.py tests/test_mimi_gpu.py tests/test_nemotron_gpu.py tests/test_memory_map.py \
  tests/test_exact_norm_rope_gpu.py tests/test_sync_free_sampling.py tests/test_minicpmo45_codes_ahead.py \
  > $OUT/gpu-suite.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-suite.txt
grep -E "passed|failed|^E |exit|^FAILED|SKIPPED" $OUT/gpu-suite.txt | cut -c1-300 | tail -24
