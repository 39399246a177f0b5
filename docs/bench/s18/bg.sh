#!/bin/bash
# session 18 (issues 23, 24): one background job that outlives the device calls (setsid), so the bench can run
# three interleaved 60 s repeats (~1,050 s) though one call may run only 600 s. device_call.sh starts it and
# polls it; every step writes under /tmp/s18 as it goes.
# Predicted: medians of three repeats near session 17's one repeat: stock loop ~1,450-1,550 ms speaking,
# ours ~140-150 ms speaking / ~26 ms listening / p99 < 200 ms / 0 late / ~19,360 MiB; the tails at their
# README numbers (token2wav graphs 48-50 ms, Mimi ~4.2 ms, Nemotron ~6.5 ms per second); GPU tests pass.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
R=/tmp/s18; mkdir -p $R; export OUT=$R
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
released_folder; stamp folder
python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds 60 --modes graphs --account-seconds 0 --stock-loop /tmp/vs/python \
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 3 --quiet --ahead tts \
  --out $R/stock-rows > $R/stock-rows.txt 2>&1; stamp "session bench (exit $?)"
rm -f $R/stock-rows/*.wav
python3 -m engine.bench.cli step-audio2 --chunks 14 --profile-chunks 1 \
  --modes stock-like,demand,graphs,graphs-reference --quiet --json $R/step-audio2-h200.json \
  > $R/step-audio2.txt 2>&1; stamp "step-audio2 (exit $?)"
python3 -m engine.bench.cli mimi --seconds 8 --warmup 2 --repeats 2 --profile-seconds 2 --json $R/mimi-h200.json \
  --quiet > $R/mimi.txt 2>&1; stamp "mimi (exit $?)"
python3 -m engine.bench.cli nemotron-codec --seconds 20 --rounds 2 --warmup 2 --window-seconds 2 \
  --window-budget-s 3 --profile-seconds 2 --json $R/nemo.json --quiet > $R/nemo.txt 2>&1; stamp "nemotron (exit $?)"
python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_gpu.py tests/test_step_audio2_gpu.py \
  tests/test_minicpmo45_stock_loop_gpu.py > $R/gpu-tests.txt 2>&1; stamp "gpu tests (exit $?)"
touch $R/DONE
