#!/bin/bash
# session 16, second call: the TTS's cost per history length past the room (probe_tts_lengths.py), then the
# first-run diagnostic planned in session 15 (first_run_diagnostic.py).
# Predicted: the step time jumps at some lengths (~690-840, ~930-1,110) by ~1.3 ms, in one of the attention ops
# (a cuBLAS kernel choice for the one-row products, or the softmax's kernel past 1,024).
cd "$(dirname "$0")/../../.."
source docs/bench/s6/device_stock_env.sh
timeout 200 python3 docs/bench/s16/probe_tts_lengths.py > $OUT/tts-lengths.txt 2>&1; echo "exit $?" >> $OUT/tts-lengths.txt
awk 'NR%4==1' $OUT/tts-lengths.txt | head -40; grep -A60 '"slow"' $OUT/tts-lengths.txt | head -70
PYTHONPATH=.:tests timeout 90 python3 docs/bench/s16/first_run_diagnostic.py > $OUT/first-run.txt 2>&1
tail -12 $OUT/first-run.txt
