#!/bin/bash
# session 23, second job (`DC_WALL=570 bash .snap/docs/bench/device_bg.sh docs/bench/s23b/bg.sh start`, then the
# same without `start`; carry .snap and .whl), after the hand-over went on by default and the MiniCPM-o build
# offers the capture lock at the end of each phase:
#  1. probe_admission.py (hand-over on: the default now);
#  2. probe_group.py with cuDNN attention off (as the backbone runs): the group step's time against own steps;
#  3. the GPU host tests (the MiniCPM-o start/stop test with hand_over off and on);
#  4. MiniCPM-o capacity in process from 5 sessions, two confirmations (s23: 6 sessions 4 of 360 late).
cd "$(dirname "$0")/../../.."
R=/tmp/s23b; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 240 python3 docs/bench/s22/probe_admission.py $R/probe-admission.json > $R/probe-admission.txt 2>&1
stamp "probe admission, hand-over default (exit $?)"
timeout 200 python3 docs/bench/s23/probe_group.py $R/probe-group.json > $R/probe-group.txt 2>&1
stamp "probe group, cuDNN attention off (exit $?)"
timeout 200 python3 -m pytest -q -m gpu -s tests/test_host_gpu.py > $R/gpu-tests.txt 2>&1
stamp "gpu tests host (exit $?)"
timeout 420 python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --seconds 60 --max-sessions 7 --start 5 --modes optimized --window 6 --time-limit 390 \
  --confirm-tries 2 --solo-sessions 1 --solo-seconds 6 --switch-interval 1 \
  --json $R/capacity-minicpmo.json > $R/capacity-minicpmo.txt 2>&1
stamp "capacity minicpm-o (exit $?)"
touch $R/DONE
