#!/bin/bash
# next session: the stock loop's torch.compile row (the demo's compile mode: apply_torch_compile + a 10 s warm-up),
# with the eager stock beside it in the same run (the row says whether compile kept the eager run's bits), 20 s.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
timeout 480 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-20} --modes graphs --stock-loop /tmp/vs/python --stock-loop-folder /tmp/mc-released \
  --stock-loop-modes eager,compile --stock-loop-compile-timeout 420 --stock-loop-repeats 1 --quiet \
  --out $OUT/compile-rows > $OUT/compile-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/compile-rows.txt; grep -v Warning $OUT/compile-rows.txt | tail -30
