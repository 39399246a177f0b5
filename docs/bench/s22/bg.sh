#!/bin/bash
# session 22, first job (`DC_WALL=560 bash .snap/docs/bench/device_bg.sh docs/bench/s22/bg.sh start`, then the
# same without `start`; its archive is s22.tar.gz):
#  1. probe_norms.py (session 21's, never run): RMSNorm / q norm / RoPE / SiLU*up / residual at r rows vs alone;
#  2. the Step-Audio2 decoder pairs: 16 sessions built at once (--start 16), 60 s at 16 (issue 24's target).
cd "$(dirname "$0")/../../.."
R=/tmp/s22; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=.
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 120 python3 docs/bench/s21/probe_norms.py $R/probe-norms.json > $R/probe-norms.txt 2>&1; stamp "probe norms (exit $?)"
timeout 470 python3 -m engine.bench.cli capacity --tail step-audio2 --size released --device cuda --seconds 60 \
  --max-sessions 16 --start 16 --modes optimized --window 3 --time-limit 440 --confirm-tries 1 --solo-sessions 1 \
  --solo-seconds 6 --json $R/cap_step_audio2.json > $R/cap_step_audio2.txt 2>&1
stamp "step-audio2 pairs at 16 (exit $?)"
touch $R/DONE
