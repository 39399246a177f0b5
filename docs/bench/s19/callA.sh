#!/bin/bash
# session 19, call A (foreground, ~4 min): where token2wav's 48.8 ms go, and which fp32 linear variants keep the
# stock's bits with fewer kernels (issue 23 asks token2wav <= 47 ms).
cd "$(dirname "$0")/../../.."
source docs/bench/s6/device_stock_env.sh > $OUT/env.txt 2>&1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv > $OUT/gpu.txt 2>&1
timeout 150 python3 docs/bench/s18/probe_t2w_gemm.py > $OUT/probe-t2w-gemm.txt 2>&1; echo "probe exit $?"
timeout 200 python3 -m engine.bench.cli step-audio2 --chunks 10 --profile-chunks 1 \
  --modes graphs,graphs-reference --quiet --json $OUT/step-audio2-h200.json > $OUT/step-audio2.txt 2>&1
echo "bench exit $?"; tail -25 $OUT/step-audio2.txt
