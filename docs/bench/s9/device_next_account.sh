#!/bin/bash
# next session (issue 23): where a model-policy second goes. Our graphs mode reading the released folder (the
# model decides its turns, as with a real checkpoint), 30 s, with 4 seconds re-run under the profiler (kernel ms,
# launches, graph launches, copies, CPU ops and the kernel table per speaking and listening second) and the
# memory map; then the memory map's GPU test.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
timeout 380 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --backbone-checkpoint /tmp/mc-released --voice /tmp/mc-released/voice.npz --seconds ${DC_SECONDS:-30} --modes graphs --flip-seconds 0 \
  --account-seconds 4 --quiet --out $OUT/mc-model > $OUT/mc-model.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/mc-model.txt; grep -v Warning $OUT/mc-model.txt | tail -45
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_memory_map.py 2>&1 | tail -12
