#!/bin/bash
# session 22, fourth job (`DC_WALL=330 bash .snap/docs/bench/device_bg.sh docs/bench/s22d/bg.sh start`; carry .snap
# .whl): probe_admission.py — the seconds around a 4th and a 5th whole MiniCPM-o session's admission.
cd "$(dirname "$0")/../../.."
R=/tmp/s22d; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=.
t0=$(date +%s)
timeout 300 python3 docs/bench/s22/probe_admission.py $R/probe-admission.json > $R/probe-admission.txt 2>&1
echo "probe admission (exit $?) done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt
touch $R/DONE
