#!/bin/bash
# session 13, call 3: (1) issue 23's 60 s run of ours alone (graphs), now that a built session is frozen out of the
# cyclic collector (call 2's slowest second, 509 ms at second 18 with SPEAK 373, matched a full collection) and each
# run names its slowest second with its graph captures and GC time; (2) issue 24's capacity with the stock loop's
# count in the same run, in the time left (the bench shortens its confirmation and says so).
# Predicted: (1) mean speaking ~163-170 ms, listening ~29-31 ms, p99 <= 250 ms, 0 misses, the slowest second the
# first speaking one (THINK ~180) with 0 ms of GC; (2) the stock loop 0 (it misses alone); ours ramps clean to 4-5.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
timeout 150 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --backbone-checkpoint /tmp/mc-released --voice /tmp/mc-released/voice.npz --seconds 60 --modes graphs --account-seconds 0 \
  --flip-seconds 0 --no-digests --quiet --out $OUT/ours-60s > $OUT/ours-60s.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/ours-60s.txt; grep -v Warning $OUT/ours-60s.txt | head -30
left=$(( ${DC_WALL:-575} - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --stock-loop /tmp/vs/python --stock-loop-folder /tmp/mc-released --seconds 60 --max-sessions 8 \
  --modes optimized --window 6 --time-limit $(( left - 15 )) --confirm-tries 1 --solo-sessions 1 --solo-seconds 6 \
  --json $OUT/capacity-minicpmo-stock.json > $OUT/capacity-minicpmo-stock.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/capacity-minicpmo-stock.txt
grep -v Warning $OUT/capacity-minicpmo-stock.txt | grep -v "^  \|^Traceback\|Error" | tail -26
