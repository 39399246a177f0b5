#!/bin/bash
# session 11, call 2: builds and captures beside other sessions' seconds (the gate's capturing hold, captures
# begun without a device sync, capture streams from their own pool). GPU tests of the host, the core and
# token2wav's lanes first, then the MiniCPM-o capacity bench again (call 1: knee 4 in the ramp, 3 confirmed
# but for 1 miss; the misses came after the builds that stalled every session).
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -s -rs tests/test_host_gpu.py tests/test_core_gpu.py \
  tests/test_step_audio2_gpu.py tests/test_core_graphs.py > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED|during another" $OUT/gpu-tests.txt | cut -c1-300 | tail -15
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( 585 - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --seconds 60 --max-sessions 8 --modes optimized --window 8 --time-limit $(( left - 15 )) \
  --solo-sessions 2 --solo-seconds 10 --json $OUT/capacity-minicpmo.json > $OUT/capacity-minicpmo.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/capacity-minicpmo.txt
grep -v Warning $OUT/capacity-minicpmo.txt | tail -30
