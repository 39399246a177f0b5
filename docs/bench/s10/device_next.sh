#!/bin/bash
# next session, first call (issue 23): is a CUDA graph replayed once slower than the work it replaces
# (docs/bench/s10/probe_replay_once.py: the TTS's between-attention step vs capture / first / second replay of a
# per-length graph), then the model-policy rows against the stock loop with each of our modes' peaks its own
# (run_mode resets the peak after emptying the cache; bench.json: peak_reserved_bytes next to max_reserved_bytes).
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
if [ "${DC_PROBE:-1}" = 1 ]; then      # measured in session 11 (docs/device-notes-session11.md): DC_PROBE=0 skips it
  timeout 120 python3 docs/bench/s10/probe_replay_once.py $OUT/replay-once.json > $OUT/replay-once.txt 2>&1
  echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/replay-once.txt; tail -2 $OUT/replay-once.txt
fi
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( 580 - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-30} --modes graphs --stock-loop /tmp/vs/python --stock-loop-folder /tmp/mc-released \
  --stock-loop-modes eager --stock-loop-repeats 1 --quiet --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -30
