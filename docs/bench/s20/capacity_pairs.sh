#!/bin/bash
# session 20, last call (foreground, ~400 s; `bash .snap/docs/bench/s20/capacity_pairs.sh` with .snap and .whl
# carried): issue 24's decoder pairs with token2wav at 38.8 ms: synthetic backbone (MiniCPM-o's TTS size) +
# released Step-Audio2 token2wav up to 16 sessions, then + released Mimi up to 32 (the earlier runs stopped at the
# most they were asked for: 8 and 16).
cd "$(dirname "$0")/../../.."
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=.
timeout 215 python3 -m engine.bench.cli capacity --tail step-audio2 --size released --device cuda --seconds 60 \
  --max-sessions 16 --modes optimized --window 3 --time-limit 200 --confirm-tries 1 --solo-sessions 1 \
  --solo-seconds 6 --json $OUT/cap_step_audio2_s20.json > $OUT/cap_step_audio2_s20.txt 2>&1
echo "step-audio2 exit $?"; grep -v -i warn $OUT/cap_step_audio2_s20.txt | tail -8
timeout 170 python3 -m engine.bench.cli capacity --tail mimi --size released --device cuda --seconds 60 \
  --max-sessions 32 --modes optimized --window 3 --time-limit 160 --confirm-tries 1 --solo-sessions 1 \
  --solo-seconds 6 --json $OUT/cap_mimi_s20.json > $OUT/cap_mimi_s20.txt 2>&1
echo "mimi exit $?"; grep -v -i warn $OUT/cap_mimi_s20.txt | tail -8
