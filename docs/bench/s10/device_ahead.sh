#!/bin/bash
# session 10 (issue 23): the next second prepared in the idle time before it (exact_graphs.py, DecodeGraphs.ahead).
# 1. the MiniCPM-o GPU tests, with the three new ones (whole forwards at exact positions over 36 released layers,
#    TTS steps captured ahead past the room, a tiny session with ahead in graphs and flipped modes == stock-like);
# 2. the model-policy session bench (30 s, released folder, graphs, 4 seconds under the profiler, memory map);
# 3. with the time left: the tiny stock-loop proof, flipped (MiniCPM-o-Demo's own loop on CUDA vs ours, with ahead).
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_gpu.py -x > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt; tail -5 $OUT/gpu-tests.txt
left=$(( 540 - ($(date +%s) - t0) - 90 ))
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --backbone-checkpoint /tmp/mc-released --voice /tmp/mc-released/voice.npz --seconds ${DC_SECONDS:-30} --modes graphs --flip-seconds 0 \
  --account-seconds 4 --quiet --out $OUT/mc-model > $OUT/mc-model.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/mc-model.txt; grep -v Warning $OUT/mc-model.txt | head -30 | tail -22
left=$(( 580 - ($(date +%s) - t0) ))
[ $left -gt 60 ] && timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py -k flipped > $OUT/tiny-stock.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/tiny-stock.txt; tail -4 $OUT/tiny-stock.txt
