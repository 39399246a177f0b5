#!/bin/bash
# session 23, first job (`DC_WALL=570 bash .snap/docs/bench/device_bg.sh docs/bench/s23/bg.sh start`, then the same
# without `start`; carry .snap (HEAD without docs/ + docs/bench/device_bg.sh + docs/bench/s22 + s23) and .whl):
#  1. probe_admission.py with the build hand-over on (session 22: 5-12 s seconds while a session was built);
#  2. probe_group.py: the group LLM step's row verdicts, check at 2/4/8 sessions, and its time against own steps;
#  3. the GPU tests of the host and the core (the MiniCPM-o start/stop test with hand_over off and on);
#  4. MiniCPM-o capacity in process with the hand-over on, from 4 sessions.
cd "$(dirname "$0")/../../.."
R=/tmp/s23; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
HAND_OVER=1 timeout 240 python3 docs/bench/s22/probe_admission.py $R/probe-admission-handover.json \
  > $R/probe-admission-handover.txt 2>&1; stamp "probe admission, hand-over on (exit $?)"
timeout 240 python3 docs/bench/s23/probe_group.py $R/probe-group.json > $R/probe-group.txt 2>&1
stamp "probe group (exit $?)"
timeout 330 python3 -m pytest -q -m gpu -s tests/test_host_gpu.py tests/test_core_gpu.py > $R/gpu-tests.txt 2>&1
stamp "gpu tests host+core (exit $?)"
timeout 330 python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --seconds 60 --max-sessions 6 --start 4 --modes optimized --window 6 --time-limit 300 \
  --confirm-tries 1 --solo-sessions 1 --solo-seconds 6 --switch-interval 1 --hand-over \
  --json $R/capacity-minicpmo.json > $R/capacity-minicpmo.txt 2>&1
stamp "capacity minicpm-o, hand-over (exit $?)"
touch $R/DONE
