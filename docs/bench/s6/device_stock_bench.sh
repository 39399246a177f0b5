#!/bin/bash
# next session: the bench's stock-loop rows at released dims on the H200 (issue 21 item 5): MiniCPM-o-Demo's
# own loop as its users run it (eager; its torch.compile mode in a later call: its warm-up alone takes minutes),
# interleaved with our modes, medians of repeats. Writes the released folder first (80 s on the H200).
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
[ -f /tmp/mc-released/config.json ] || python3 tests/minicpmo45_stock_folder.py /tmp/mc-released --size released > $OUT/released-folder.txt 2>&1
echo "folder ready after $(( $(date +%s) - t0 )) s"
timeout 480 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-30} --modes stock,graphs --stock-loop /tmp/vs/python --stock-loop-folder /tmp/mc-released \
  --stock-loop-modes eager --stock-loop-repeats ${DC_REPEATS:-1} --quiet --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -25
