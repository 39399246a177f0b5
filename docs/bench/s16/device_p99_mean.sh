#!/bin/bash
# session 16, first call (issue 23): the flush on the live executor (a turn's last 3 tokens replay a graph captured
# at start), the TTS past its room on the prepared between-attention graphs with the one-query lane; GPU tests,
# then the stock loop and ours side by side over 60 s (the released folder written first).
# Predicted: tests pass; second 45 (the deferred flush) ~150 ms instead of 500.8 (SPEAK ~35); THINK's TTS part past
# the room ~48-52 ms instead of 57-60; second 9 no longer pays a capture (~145 ms instead of 186); mean speaking
# ~143-148 ms, listening ~26, p99 ~195 ms, 0 late, peak reserved within +50 MiB of 19,544.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_step_audio2_gpu.py \
  tests/test_minicpmo45_gpu.py -k "chunked or past_the_room or model_policy or decode_graphs or captured_ahead or turns_stock" \
  > $OUT/gpu-tests.txt 2>&1
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
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 1 --quiet \
  --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -44
python3 - $OUT/stock-rows/session-graphs-1.csv <<'P' 2>&1 | head -64
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["index"], r["decision"], *(f"{float(r[k] or 0):7.1f}" for k in ("total_ms", "listen_ms", "think_ms", "think_tts_ms", "speak_ms")))
P
