#!/bin/bash
# next session (issue 23): the model-policy rows against MiniCPM-o-Demo's own loop (eager, as its users run it) in
# one run, now that captures neither synchronize the device nor empty the allocator's cache: ours' reserved memory
# and its own peak (bench.json: peak_reserved_bytes, max_reserved_bytes, the memory map) against the stock's.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( 580 - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-30} --modes graphs --stock-loop /tmp/vs/python --stock-loop-folder /tmp/mc-released \
  --stock-loop-modes eager --stock-loop-repeats 1 --quiet --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -30
