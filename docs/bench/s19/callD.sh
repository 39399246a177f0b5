#!/bin/bash
# session 19, calls D and E (foreground, ~5 min; run from .snap: `bash .snap/docs/bench/s19/callD.sh`): the split-K linears (one Triton kernel per DiT linear, cuBLAS's
# summation order found by probe_splitk.py): tile timings, the GPU tests that prove the bits, then the token2wav
# bench (graphs with the new path self-checked, against the reference paths and the stock as users run it).
cd "$(dirname "$0")/../../.."
source docs/bench/s6/device_stock_env.sh > $OUT/env.txt 2>&1
timeout 120 python3 docs/bench/s19/probe_linear_tiles.py > $OUT/probe-linear-tiles.txt 2>&1; echo "tiles exit $?"
cat $OUT/probe-linear-tiles.txt | grep -v -i warn | head -60
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rs -o addopts="" tests/test_step_audio2_linears.py \
  tests/test_step_audio2_gpu.py > $OUT/gpu-tests.txt 2>&1; echo "gpu tests exit $?"; tail -4 $OUT/gpu-tests.txt
timeout 200 python3 -m engine.bench.cli step-audio2 --chunks 14 --profile-chunks 1 \
  --modes stock-like,graphs,graphs-reference --quiet --json $OUT/step-audio2-h200.json > $OUT/step-audio2.txt 2>&1
echo "bench exit $?"; grep -i "split-K\|graphs\|stock" $OUT/step-audio2.txt | head -30
