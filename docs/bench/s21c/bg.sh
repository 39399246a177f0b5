#!/bin/bash
# session 21, third job (`DC_WALL=560 bash .snap/docs/bench/device_bg.sh docs/bench/s21c/bg.sh start`, then the same
# without `start`): issue 24's decoder pairs, each confirmed 60 s now that the confirmation reserves build time only
# for sessions it builds: released Step-Audio2 token2wav + synthetic TTS-size backbone to 16 sessions (420 s), then
# released Mimi to 32 (250 s).
cd "$(dirname "$0")/../../.."
R=/tmp/s21c; mkdir -p $R; export OUT=$R
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
SA2_LIMIT=420 MIMI_LIMIT=0 bash docs/bench/s20/capacity_pairs.sh > $R/pairs-sa2.txt 2>&1; stamp "step-audio2 pairs (exit $?)"
SA2_LIMIT=0 MIMI_LIMIT=250 bash docs/bench/s20/capacity_pairs.sh > $R/pairs-mimi.txt 2>&1; stamp "mimi pairs (exit $?)"
touch $R/DONE
