#!/bin/bash
# next session: the stock-loop rows again, the stock eager cold (a worker's first session, as in session 9) and
# warmed (a worker's later session), ours in graphs mode with the memory map (whose reserved memory: graph pools,
# side-stream caches, the default stream); 30 s, one repeat (fits one 600 s call).
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
timeout 470 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-30} --modes ${DC_MODES:-graphs} --stock-loop /tmp/vs/python --stock-loop-folder /tmp/mc-released \
  --stock-loop-modes eager,warm --stock-loop-repeats ${DC_REPEATS:-1} --quiet --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -40
