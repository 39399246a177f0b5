#!/bin/bash
# session 19, call G (foreground, ~2 min): token2wav with the split-K linears' tile at (32, 32, 16, 4 warps), the
# fastest of call E's nine (15.0 us vs 15.7 at k = 512); predicted 47.1-47.3 ms (47.5 in call F).
cd "$(dirname "$0")/../../.."
source docs/bench/s6/device_stock_env.sh > $OUT/env.txt 2>&1
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_step_audio2_linears.py > $OUT/gpu-linears.txt 2>&1
echo "linears GPU test exit $?"
timeout 150 python3 -m engine.bench.cli step-audio2 --chunks 14 --profile-chunks 1 \
  --modes graphs,graphs-reference --quiet --json $OUT/step-audio2-h200.json > $OUT/step-audio2.txt 2>&1
echo "bench exit $?"; grep -E "^\| (stock|ours)|vs the|split-K linears \(50" $OUT/step-audio2.txt
