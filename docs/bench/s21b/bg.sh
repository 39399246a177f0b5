#!/bin/bash
# session 21, second job (`DC_WALL=560 bash .snap/docs/bench/device_bg.sh docs/bench/s21b/bg.sh start`, then the
# same without `start`; its archive is s21b.tar.gz):
#  1. token2wav bench on session 20's final code (the prepare hook; transposed copies keyed by storage);
#  2. probe_rows.py: which MiniCPM-o linears keep each session's bits when sessions' rows are batched;
#  3. the Step-Audio2 decoder pairs up to 16 sessions, 60 s at the knee (capacity_pairs.sh, SA2 only).
cd "$(dirname "$0")/../../.."
R=/tmp/s21b; mkdir -p $R; export OUT=$R
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 200 python3 -m engine.bench.cli step-audio2 --chunks 14 --profile-chunks 1 \
  --modes stock-like,graphs,graphs-reference --quiet --json $R/step-audio2-h200.json > $R/step-audio2.txt 2>&1
stamp "step-audio2 (exit $?)"
timeout 150 python3 docs/bench/s21/probe_rows.py $R/probe-rows.json > $R/probe-rows.txt 2>&1; stamp "probe rows (exit $?)"
SA2_LIMIT=${SA2_LIMIT:-420} MIMI_LIMIT=0 bash docs/bench/s20/capacity_pairs.sh > $R/pairs.txt 2>&1
stamp "step-audio2 pairs (exit $?)"
touch $R/DONE
