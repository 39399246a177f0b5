#!/bin/bash
# session 22, third job (as s22b: serve wheels installed to /tmp/site by the call, then
# `DC_WALL=520 bash .snap/docs/bench/device_bg.sh docs/bench/s22c/bg.sh start`; carry .snap .whl .whl-serve):
#  1. Ray Serve, one replica, whole MiniCPM-o 4.5 sessions, after the admission fix (the seconds queued behind a
#     stalled one are left out of the headroom): s22b's replica refused its 4th session at a 2,761 ms second;
#  2. the Step-Audio2 decoder pairs at 16 with a 1 ms thread switch interval (s22b at 5 ms: 20 of 960 late).
cd "$(dirname "$0")/../../.."
R=/tmp/s22c; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/site:. RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 330 python3 -m engine.bench.cli serve-capacity --backbone minicpm-o-4.5 --size released --replicas 1 \
  --seconds 30 --window 6 --max-sessions 6 --sessions-per-replica 8 --json $R/serve_minicpmo_1.json > $R/serve_minicpmo_1.txt 2>&1
stamp "serve minicpm-o, 1 replica (exit $?)"
timeout 170 python3 -m engine.bench.cli capacity --tail step-audio2 --size released --device cuda --seconds 60 \
  --max-sessions 16 --start 16 --modes optimized --window 3 --time-limit 150 --confirm-tries 1 --solo-sessions 1 \
  --solo-seconds 6 --switch-interval 1 --json $R/cap_step_audio2.json > $R/cap_step_audio2.txt 2>&1
stamp "step-audio2 pairs at 16, 1 ms switch interval (exit $?)"
touch $R/DONE
