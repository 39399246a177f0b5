#!/bin/bash
# session 20 (background across calls: `DC_WALL=560 bash .snap/docs/bench/device_bg.sh docs/bench/s20/bg.sh start`,
# then the same without `start`, each call within 30 s of the last). Predictions in docs/device-notes-session20.md.
#  1. GPU tests: the split-K linears from the transposed weight (k 512 and 2,048), token2wav == the stock package;
#  2. token2wav bench: all five 512-wide DiT linears on the split-K path (fc2 too);
#  3. the stock loop and ours side by side over 60 s, three interleaved repeats (issue 23's "done when");
#  4. issue 24: capacity of whole MiniCPM-o sessions, if at least 420 s of DC_BUDGET (default 1,300 s) are left.
cd "$(dirname "$0")/../../.."      # its own copy of the repository (/tmp/s20w/.snap, made by device_bg.sh)
R=/tmp/s20; mkdir -p $R; export OUT=$R
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_step_audio2_linears.py \
  tests/test_step_audio2_gpu.py > $R/gpu-tests-t2w.txt 2>&1; stamp "t2w GPU tests (exit $?)"
timeout 200 python3 -m engine.bench.cli step-audio2 --chunks 14 --profile-chunks 1 \
  --modes stock-like,graphs,graphs-reference --quiet --json $R/step-audio2-h200.json > $R/step-audio2.txt 2>&1
stamp "step-audio2 (exit $?)"
released_folder; stamp folder
python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds 60 --modes graphs --account-seconds 4 --stock-loop /tmp/vs/python \
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 3 --quiet --ahead tts \
  --out $R/stock-rows > $R/stock-rows.txt 2>&1; stamp "session bench (exit $?)"
rm -f $R/stock-rows/*.wav $R/stock-rows/*/*.wav
left=$(( ${DC_BUDGET:-1300} - ($(date +%s) - t0) ))
if [ $left -ge 420 ]; then
  python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released --device cuda \
    --seconds 60 --max-sessions 8 \
    --modes optimized --window 6 --time-limit $(( left - 20 )) --confirm-tries 1 --solo-sessions 1 --solo-seconds 6 \
    --switch-interval 1 --json $R/capacity-minicpmo.json > $R/capacity.txt 2>&1; stamp "capacity (exit $?)"
else
  echo "capacity skipped: $left s left" >> $R/steps.txt
fi
touch $R/DONE
