#!/bin/bash
# session 15, call 1 (issue 23): session 14's changes (CPU-proven, never run on a GPU) under the GPU tests, then the
# stock loop and ours side by side over 60 s in one run (issue 23's "done when"). Session 14's calls 1 and 2 in one:
# the device refused two starts this session (each cost ~90 s of the budget).
# GPU tests: the race and the sync-free helpers under sync-debug 'error'; the codes run ahead on CUDA; the prefill
# graphs at the released width; the grouped attention's check and all 36 layers with it; the rehearsal and prefill
# replays in the tiny session; the tiny session against MiniCPM-o-Demo's own loop with the toggles flipped.
# Predicted: tests pass (the grouped check may refuse: then its test skips with the reason); stock ~1.1 s per
# speaking second, every second late; ours 135-155 ms speaking, 24-29 ms listening, p99 <= 250 ms, 0 late; our peak
# (build included) ~19.5-19.7 GB against the stock's ~20.7 GB. Tests ~180 s, folder ~100 s, rows ~230 s.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -s -rs tests/test_sync_free_sampling.py \
  tests/test_minicpmo45_codes_ahead.py tests/test_minicpmo45_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py -k flipped \
  >> $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED|exact fused|grouped-query|SKIPPED" $OUT/gpu-tests.txt | cut -c1-300 | tail -20
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( ${DC_WALL:-585} - ($(date +%s) - t0) ))
secs=60; [ $left -lt 250 ] && secs=36
echo "rows: $secs s each, $left s left"
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds $secs --modes graphs --account-seconds 4 --stock-loop /tmp/vs/python \
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 1 --quiet \
  --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -44
python3 - $OUT/stock-rows/session-graphs-1.csv <<'P' 2>&1 | head -12
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["index"], r["decision"], *(f"{float(r[k]):7.1f}" for k in ("total_ms", "listen_ms", "think_ms", "speak_ms")))
P
