#!/bin/bash
# session 11, call 3: call 2's one failure fixed (a shared second's eager draws, e.g. the HiFT's one-off steps,
# took the default generator, which a capture beside it registers: they now name the session's own state).
# GPU tests of the host, the core (captures beside session-generator draws) and token2wav, then as much of the
# MiniCPM-o capacity bench as the device time left allows (it shortens its confirmation and says so).
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider -s -rs tests/test_core_gpu.py tests/test_host_gpu.py \
  tests/test_step_audio2_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED|during another|beside a|while B" $OUT/gpu-tests.txt | cut -c1-300 | tail -12
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( ${DC_WALL:-370} - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --seconds 60 --max-sessions 8 --modes optimized --window 6 --time-limit $(( left - 12 )) \
  --confirm-tries 1 --solo-sessions 1 --solo-seconds 6 --json $OUT/capacity-minicpmo.json > $OUT/capacity-minicpmo.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/capacity-minicpmo.txt
grep -v Warning $OUT/capacity-minicpmo.txt | grep -v "^  \|^Traceback\|Error" | tail -22
