#!/bin/bash
# session 6 call 3: the stock duplex loop on CUDA at tiny dims against our three CUDA runs (every stage)
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
export DC_STOCK_REPORT=$OUT/tiny-report.json
timeout 540 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py > $OUT/tiny.txt 2>&1
echo "exit $?" >> $OUT/tiny.txt; tail -c 6000 $OUT/tiny.txt; cat $OUT/tiny-report.json 2>/dev/null | head -60
