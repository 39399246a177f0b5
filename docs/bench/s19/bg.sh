#!/bin/bash
# session 19 (prepared in session 18): one background job across device calls (`bash .snap/docs/bench/device_bg.sh
# docs/bench/s19/bg.sh start`, then the same without `start`, each call within 30 s of the last; it starts and polls
# it; it runs from its own copy, /tmp/s19w/.snap). Order: what issue 23 still needs first, then issue 24.
#  0. the grouped-query attention's banded check (session 18) and its GPU test: how far the call runs;
#  1. the stock loop and ours side by side over 60 s, three interleaved repeats (the stock's build now under
#     no_init_weights: predicted ~60-100 s instead of 160 s a repeat; ours ~149 ms speaking as in session 18);
#  2. token2wav: the fp32 linear probe (which variants keep the stock's bits with fewer kernels), then the bench
#     with the kernel-by-name table (top_kernels_per_chunk) to see where 48.8 ms goes;
#  3. issue 24: capacity of whole MiniCPM-o sessions with the thread switch interval at 1 ms (Python's default 5 ms
#     measured 3 sessions in session 15; the same command but for the interval), if at least 420 s of DC_BUDGET (default 1,500 s of wall) are left.
cd "$(dirname "$0")/../../.."      # its own copy of the repository (/tmp/s19w/.snap, made by device_bg.sh)
R=/tmp/s19; mkdir -p $R; export OUT=$R
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rs -s tests/test_minicpmo45_gpu.py -k "grouped" \
  > $R/gpu-gqa.txt 2>&1; stamp "gqa GPU test (exit $?)"      # the banded verdict line, and the model over 2,125
released_folder; stamp folder
python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds 60 --modes graphs --account-seconds 0 --stock-loop /tmp/vs/python \
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 3 --quiet --ahead tts \
  --out $R/stock-rows > $R/stock-rows.txt 2>&1; stamp "session bench (exit $?)"
rm -f $R/stock-rows/*.wav $R/stock-rows/*/*.wav
timeout 120 python3 docs/bench/s18/probe_t2w_gemm.py > $R/probe-t2w-gemm.txt 2>&1; stamp "t2w gemm probe (exit $?)"
timeout 150 python3 -m engine.bench.cli step-audio2 --chunks 14 --profile-chunks 1 \
  --modes stock-like,demand,graphs,graphs-reference --quiet --json $R/step-audio2-h200.json \
  > $R/step-audio2.txt 2>&1; stamp "step-audio2 (exit $?)"
left=$(( ${DC_BUDGET:-1500} - ($(date +%s) - t0) ))
if [ $left -ge 420 ]; then
  python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released --device cuda \
    --seconds 60 --max-sessions 8 \
    --modes optimized --window 6 --time-limit $(( left - 20 )) --confirm-tries 1 --solo-sessions 1 --solo-seconds 6 \
    --switch-interval 1 --json $R/capacity-minicpmo.json > $R/capacity.txt 2>&1; stamp "capacity (exit $?)"
else
  echo "capacity skipped: $left s left" >> $R/steps.txt
fi
touch $R/DONE
