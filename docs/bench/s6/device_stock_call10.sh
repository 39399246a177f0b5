#!/bin/bash
# session 6 call 10: the tiny CUDA comparison after the RoPE/contiguity fixes, then (time allowing) the stock
# loop alone at released dims on CUDA, eager, no records: its per-second wall time as its users run it
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
export DC_STOCK_REPORT=$OUT/tiny-report.json
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py > $OUT/tiny.txt 2>&1
echo "exit $?" >> $OUT/tiny.txt
python3 -c "
import json; d=json.load(open('$OUT/tiny-report.json'))
for k,v in d.items():
    if isinstance(v, dict) and 'first_differences' in v:
        print(k, 'equal', v['equal_seconds'], '/', v['seconds'], 'speaking', v['speaking_seconds'], 'ends', v['turn_ends']); print('  ', list(v['first_differences'].items())[:6])
    else: print(k, v)
"; tail -2 $OUT/tiny.txt
t0=$(date +%s)
python3 tests/minicpmo45_stock_folder.py /tmp/mc-released --size released > $OUT/released-folder.txt 2>&1
echo "folder written in $(( $(date +%s) - t0 )) s" | tee -a $OUT/released-folder.txt
python3 -c "import sys; sys.path.insert(0,'tests'); import test_minicpmo45_stock_loop as S; from pathlib import Path; S._input(Path('/tmp/in60.wav'), 60)"
/tmp/vs/python tests/stock_loop/run_stock.py --oracle shared-oracles/MiniCPM-o-Demo-28b60cf --folder /tmp/mc-released --wav /tmp/in60.wav --out $OUT/stock-released --seed 1 --device cuda --no-record --force-listen 20 > $OUT/stock-released.txt 2>&1
echo "stock exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-released.txt; tail -5 $OUT/stock-released.txt
