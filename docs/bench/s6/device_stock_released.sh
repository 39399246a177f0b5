#!/bin/bash
# session 6: the stock duplex loop on CUDA at released dims (seeded random bf16 weights, written here) against
# our run with the toggles flipped every second (both modes alternate), 60 s, every stage
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
python3 tests/minicpmo45_stock_folder.py /tmp/mc-released --size released > $OUT/released-folder.txt 2>&1
echo "folder written in $(( $(date +%s) - t0 )) s: $(du -sh /tmp/mc-released | cut -f1)" | tee -a $OUT/released-folder.txt
export DC_STOCK_REPORT=$OUT/released-report.json DC_STOCK_FOLDER=/tmp/mc-released DC_STOCK_SECONDS=${DC_STOCK_SECONDS:-60}
timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py -k "${DC_MODES:-flipped}" > $OUT/released.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/released.txt; tail -c 1500 $OUT/released.txt; cat $OUT/released-report.json 2>/dev/null | head -40
