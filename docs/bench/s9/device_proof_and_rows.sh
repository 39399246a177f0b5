#!/bin/bash
# session 9, call 1: issue 21's released-dims proof (60 s, toggles flipped every second, against MiniCPM-o-Demo's
# own loop on CUDA), then in the time left the bench's stock-loop rows (the stock as its users run it, eager,
# interleaved with ours). One call so the 16 GB released folder is written once.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
python3 tests/minicpmo45_stock_folder.py /tmp/mc-released --size released > $OUT/released-folder.txt 2>&1
echo "folder written in $(( $(date +%s) - t0 )) s: $(du -sh /tmp/mc-released | cut -f1)" | tee -a $OUT/released-folder.txt
export DC_STOCK_REPORT=$OUT/released-report.json DC_STOCK_FOLDER=/tmp/mc-released DC_STOCK_SECONDS=${DC_STOCK_SECONDS:-60}
timeout ${DC_PROOF_LIMIT:-330} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py -k "${DC_MODES:-flipped}" > $OUT/released.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/released.txt; tail -c 1200 $OUT/released.txt; head -c 1500 $OUT/released-report.json 2>/dev/null; echo
left=$(( 585 - ($(date +%s) - t0) ))
echo "bench limit ${left} s"
[ $left -gt 60 ] && timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-30} --modes stock,graphs --stock-loop /tmp/vs/python --stock-loop-folder /tmp/mc-released \
  --stock-loop-modes eager --stock-loop-repeats ${DC_REPEATS:-1} --quiet --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -25
