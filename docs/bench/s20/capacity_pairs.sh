#!/bin/bash
# session 20, last call (foreground, ~400 s; `bash .snap/docs/bench/s20/capacity_pairs.sh` with .snap and .whl
# carried): issue 24's decoder pairs with token2wav at 38.8 ms: synthetic backbone (MiniCPM-o's TTS size) +
# released Step-Audio2 token2wav up to 16 sessions, then + released Mimi up to 32 (the earlier runs stopped at the
# most they were asked for: 8 and 16). In session 20 the limits below (215 s / 170 s) were too short: the 16
# Step-Audio2 sessions' builds ran past 215 s and the 32 Mimi sessions' confirmation got 5 s. Next time give each
# its own call: `SA2_LIMIT=420 MIMI_LIMIT=0 bash ...`, then `SA2_LIMIT=0 MIMI_LIMIT=260 bash ...` (0 skips one).
cd "$(dirname "$0")/../../.."
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=.
SA2=${SA2_LIMIT:-200}; MIMI=${MIMI_LIMIT:-160}
if [ "$SA2" -gt 0 ]; then
  timeout $((SA2 + 15)) python3 -m engine.bench.cli capacity --tail step-audio2 --size released --device cuda \
    --seconds 60 --max-sessions 16 --modes optimized --window 3 --time-limit $SA2 --confirm-tries 1 --solo-sessions 1 \
    --solo-seconds 6 --json $OUT/cap_step_audio2.json > $OUT/cap_step_audio2.txt 2>&1
  echo "step-audio2 exit $?"; grep -v -i warn $OUT/cap_step_audio2.txt | tail -8
fi
if [ "$MIMI" -gt 0 ]; then
  timeout $((MIMI + 10)) python3 -m engine.bench.cli capacity --tail mimi --size released --device cuda --seconds 60 \
    --max-sessions 32 --modes optimized --window 3 --time-limit $MIMI --confirm-tries 1 --solo-sessions 1 \
    --solo-seconds 6 --json $OUT/cap_mimi.json > $OUT/cap_mimi.txt 2>&1
  echo "mimi exit $?"; grep -v -i warn $OUT/cap_mimi.txt | tail -8
fi
