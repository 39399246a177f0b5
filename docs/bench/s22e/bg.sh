#!/bin/bash
# session 22, fifth job (`DC_WALL=200 bash .snap/docs/bench/device_bg.sh docs/bench/s22e/bg.sh start`; carry .snap):
# probe_capture_stall.py — does a capturing thread stall another thread's eager work (and why)?
cd "$(dirname "$0")/../../.."
R=/tmp/s22e; mkdir -p $R; export OUT=$R
export PYTHONPATH=.
t0=$(date +%s)
timeout 120 python3 docs/bench/s22/probe_capture_stall.py $R/probe-capture-stall.json > $R/probe-capture-stall.txt 2>&1
echo "probe capture stall (exit $?) done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt
touch $R/DONE
