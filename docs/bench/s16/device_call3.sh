#!/bin/bash
# session 16, third call (issue 23): call 1 (device_p99_mean.sh) again after the lean loop of the TTS past its room
# (per layer the graph, then the one query's 5 kernels, nothing else). Call 1 got mean speaking 155.3 ms with seconds
# 26-30 and 34-39 at ~85 ms of TTS (a slower host: the stock loop itself took 1,522 ms against 1,277 in session 15;
# the probe, call 2, found the step flat at every length, 2.7-2.85 ms). Predicted: TTS past the room ~46-50 ms where
# the host is quiet; mean speaking 143-150 ms; p99 ~200-215; 0 late; peak ~19,360 MiB.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
  tests/test_minicpmo45_gpu.py -k "past_the_room or model_policy or decode_graphs" \
  > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED|SKIPPED" $OUT/gpu-tests.txt | cut -c1-300 | tail -20
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
python3 - $OUT/stock-rows/session-graphs-1.csv <<'P' 2>&1 | head -64
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["index"], r["decision"], *(f"{float(r[k] or 0):7.1f}" for k in ("total_ms", "listen_ms", "think_ms", "think_tts_ms", "speak_ms")))
P
