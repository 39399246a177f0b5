#!/bin/bash
# session 12's first call (issue 23): the exact fused RMSNorm/RoPE (engine/kernels, CPU-proven under Triton's
# interpreter only) on the H200 -- the start-up check, the released layer and TTS graphs with them against eager,
# the tiny session against MiniCPM-o-Demo's own loop with the toggles flipped -- then the model-policy rows against
# the stock loop with per-second kernel accounting (bench.json: kernels, launches, kernel ms per speaking second;
# session 10 without the kernels: 48,595 kernels, 147.4 kernel ms, 252.1 ms wall), and each mode's peak memory.
# Predicted: the check chooses the kernels; every GPU test passes; a speaking second runs ~29-32k kernels (30 fewer
# per LLM layer, 18 per TTS layer), ~100-110 kernel ms and ~205-215 ms wall; the stock loop ~1.5 s per speaking second.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -s -rs tests/test_exact_norm_rope_gpu.py \
  tests/test_minicpmo45_gpu.py > $OUT/gpu-tests.txt 2>&1
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py -k flipped \
  >> $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED|exact fused" $OUT/gpu-tests.txt | cut -c1-300 | tail -14
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( ${DC_WALL:-585} - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-24} --modes graphs --account-seconds 4 --stock-loop /tmp/vs/python \
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 1 --quiet \
  --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -36
