#!/bin/bash
# session 14, second call (issue 23's "done when"): the stock loop (MiniCPM-o-Demo's own duplex loop, eager, as its
# users run it) and ours (graphs) side by side in one run over 60 s, interleaved, with the per-second accounting of
# four seconds and the memory map. Run after call 1 passed. (No decoder tail changed in session 14: their numbers stand;
# token2wav's per second shows here as SPEAK, ~23.7 ms in session 13.)
# Predicted: stock ~1.1 s per speaking second, every second late; ours 140-155 ms speaking, 25-29 ms listening,
# p99 <= 250 ms, 0 late; our peak (build included) ~19.5-19.7 GB against the stock's ~20.7 GB.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( ${DC_WALL:-470} - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-60} --modes graphs --account-seconds 4 --stock-loop /tmp/vs/python \
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 1 --quiet \
  --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -44
