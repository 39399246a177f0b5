#!/bin/bash
# session 17, first call (issue 23, the mean speaking second): the TTS steps of a reply past its prepared room get
# their per-length graphs in the idle time between seconds (--ahead tts, now the default of the bench and the live
# worker), each launched once there (its upload); GPU tests, then the stock loop and ours side by side over 60 s.
# Predicted: tests pass (the TTS ahead test with its stop, the tiny session vs MiniCPM-o-Demo with the toggles
# flipped, now preparing ahead); THINK's TTS part past the room ~42-45 ms (the in-room seconds' 42) instead of
# 50-92; mean speaking ~140 ms (session 16: 155.3), listening ~26, p99 < 215, 0 late; ahead_ms per second
# ~200-450 ms (31-45 captures), well inside the idle time; peak reserved within +50 MiB of 19,358.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_gpu.py \
  -k "captured_ahead or past_the_room or prepared_ahead" > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py -k flipped \
  >> $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED|SKIPPED" $OUT/gpu-tests.txt | cut -c1-300 | tail -20
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( ${DC_WALL:-585} - ($(date +%s) - t0) ))
secs=60; [ $left -lt 250 ] && secs=36
echo "rows: $secs s each, $left s left"
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds $secs --modes graphs --account-seconds 4 --stock-loop /tmp/vs/python \
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 1 --quiet --ahead tts \
  --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | head -16
python3 - $OUT/stock-rows/session-graphs-1.csv <<'P' 2>&1 | head -64
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["index"], r["decision"], *(f"{float(r[k] or 0):7.1f}" for k in ("total_ms", "listen_ms", "think_ms",
          "think_tts_ms", "speak_ms", "ahead_ms")), r["ahead_captures"])
P
