#!/bin/bash
# session 22, second job (the call first installs the serve wheels:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-serve/*.whl
# then `DC_WALL=540 bash .snap/docs/bench/device_bg.sh docs/bench/s22b/bg.sh start`, and the same without `start`;
# carry .snap (HEAD without docs/ and the oracles), .whl, .whl-serve; the archive is s22b.tar.gz):
#  1. the Step-Audio2 decoder pairs at 16, built before fed (session 22's ramp fix), 60 s at 16 (issue 24's target);
#  2. Ray Serve, one replica on one H200, hosting whole MiniCPM-o 4.5 sessions (released dims, random weights):
#     the replica's own admission (with LoadMeter.pause) decides how many it takes.
cd "$(dirname "$0")/../../.."
R=/tmp/s22b; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/site:. RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 380 python3 -m engine.bench.cli capacity --tail step-audio2 --size released --device cuda --seconds 60 \
  --max-sessions 16 --start 16 --modes optimized --window 3 --time-limit 340 --confirm-tries 1 --solo-sessions 1 \
  --solo-seconds 6 --json $R/cap_step_audio2.json > $R/cap_step_audio2.txt 2>&1
stamp "step-audio2 pairs at 16 (exit $?)"
timeout 420 python3 -m engine.bench.cli serve-capacity --backbone minicpm-o-4.5 --size released --replicas 1 \
  --seconds 30 --window 6 --max-sessions 6 --sessions-per-replica 8 --json $R/serve_minicpmo_1.json > $R/serve_minicpmo_1.txt 2>&1
stamp "serve minicpm-o, 1 replica (exit $?)"
touch $R/DONE
