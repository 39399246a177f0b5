#!/bin/bash
# Prepared in session 23 for the next session (`DC_WALL=570 bash .snap/docs/bench/device_bg.sh docs/bench/s24/bg.sh
# start`, then the same without `start` until ALL-DONE; carry .snap (HEAD without docs/ + docs/bench/device_bg.sh,
# s6, s22, s23, s24) and .whl; the archive is s24.tar.gz). ~1,500 s in all, most valuable first:
#  1. the GPU test of LLM rounds (4 tiny MiniCPM-o sessions in rounds, each identical to solo; rounds ran);
#  2. capacity --modes rounds from 4 at released dims (groups of 4: the size proven over long histories);
#  3. probe_group.py: where the 8-row group step parts from each member's own step (s23b: not identical at 8);
#  4. the session bench, one MiniCPM-o session (released dims), 20 s, with the host operators' call sites;
#  5. probe_t2w_rows.py: a Step-Audio2 DiT block over S sessions' chunks — bits per piece, and the time;
#  6. probe_admission.py with STACKS=1 (a build stall caught with every thread's frames).
cd "$(dirname "$0")/../../.."
R=/tmp/s24; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 300 python3 -m pytest -q -m gpu -s tests/test_host_gpu.py -k "llm_rounds" > $R/gpu-rounds.txt 2>&1
stamp "gpu test, llm rounds (exit $?)"
timeout 480 python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --seconds 60 --max-sessions 8 --start 4 --modes rounds --batch-slots 4 --window 6 --time-limit 450 \
  --confirm-tries 2 --solo-sessions 2 --solo-seconds 6 --switch-interval 1 \
  --json $R/capacity-rounds.json > $R/capacity-rounds.txt 2>&1
stamp "capacity, llm rounds (exit $?)"
timeout 240 python3 docs/bench/s23/probe_group.py $R/probe-group.json > $R/probe-group.txt 2>&1
stamp "probe group, per piece (exit $?)"
timeout 300 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda --seconds 20 \
  --modes graphs --flip-seconds 0 --no-digests --account-seconds 4 --account-sites --quiet --out $R/sites \
  > $R/sites.txt 2>&1
stamp "session bench with host sites (exit $?)"
timeout 150 python3 docs/bench/s23/probe_t2w_rows.py $R/probe-t2w-rows.json > $R/probe-t2w-rows.txt 2>&1
stamp "probe t2w rows (exit $?)"
STACKS=1 timeout 240 python3 docs/bench/s22/probe_admission.py $R/probe-admission.json > $R/probe-admission.txt 2>&1
stamp "probe admission with stacks (exit $?)"
touch $R/DONE
