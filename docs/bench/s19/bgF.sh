#!/bin/bash
# session 19, call F (background across two calls: `bash .snap/docs/bench/device_bg.sh docs/bench/s19/bgF.sh start`,
# then the same without `start` within 30 s of the first call's end). The split-K linears on the attention only
# (the MLP's second layer back on cuBLAS: ours was 50 us to its 35 at k = 2,048):
#  1. token2wav bench: predicted ~46 ms (47.9 with fc2 on ours; fc2 cost ~12 us x 160 a chunk);
#  2. GPU tests: the linears' bits, token2wav == the stock package, MiniCPM-o's loop == the stock loop;
#  3. our MiniCPM-o session over 60 s of the released-dims folder, graphs (no stock loop: its three repeats need
#     ~1,000 s of device time, more than this session has left).
cd "$(dirname "$0")/../../.."
R=/tmp/s19; mkdir -p $R; export OUT=$R
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 200 python3 -m engine.bench.cli step-audio2 --chunks 14 --profile-chunks 1 \
  --modes stock-like,graphs,graphs-reference --quiet --json $R/step-audio2-h200.json > $R/step-audio2.txt 2>&1
stamp "step-audio2 (exit $?)"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_step_audio2_linears.py \
  tests/test_step_audio2_gpu.py > $R/gpu-tests-t2w.txt 2>&1; stamp "t2w GPU tests (exit $?)"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py \
  > $R/gpu-tests-stock-loop.txt 2>&1; stamp "stock loop GPU tests, tiny dims (exit $?)"
released_folder; stamp folder
python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda --seconds 60 \
  --modes graphs --backbone-checkpoint /tmp/mc-released --voice /tmp/mc-released/voice.npz --account-seconds 4 --quiet --ahead tts \
  --out $R/session > $R/session.txt 2>&1; stamp "session bench (exit $?)"
rm -f $R/session/*.wav $R/session/*/*.wav
touch $R/DONE
