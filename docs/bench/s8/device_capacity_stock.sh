#!/bin/bash
# issue 24 item 3 on the H200: whole MiniCPM-o 4.5 sessions per GPU with the stock loop's count in the same run
# (MiniCPM-o-Demo's own loop, one session, eager: 1 when it keeps every second, else 0), then ours ramped, confirmed
# at the knee and re-run alone. Writes the released folder first (80 s on the H200). Not yet run (session 8 had
# no device time left).
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
[ -f /tmp/mc-released/config.json ] || python3 tests/minicpmo45_stock_folder.py /tmp/mc-released --size released > $OUT/released-folder.txt 2>&1
echo "folder ready after $(( $(date +%s) - t0 )) s"
timeout 540 python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --stock-loop /tmp/vs/python --stock-loop-folder /tmp/mc-released --seconds ${DC_SECONDS:-60} \
  --max-sessions ${DC_MAX:-8} --modes optimized --window 8 --time-limit 420 --solo-sessions 2 --solo-seconds 10 \
  --json $OUT/capacity-minicpmo-stock.json > $OUT/capacity-minicpmo-stock.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/capacity-minicpmo-stock.txt
grep -v Warning $OUT/capacity-minicpmo-stock.txt | tail -25
