#!/bin/bash
# Prepared in session 23 for the next session's first call (`DC_WALL=570 bash .snap/docs/bench/device_bg.sh
# docs/bench/s24/bg.sh start`, then the same without `start`; carry .snap (HEAD without docs/ + docs/bench/
# device_bg.sh, s6, s22, s23, s24) and .whl; the archive is s24.tar.gz):
#  1. probe_group.py: where the 8-row group step parts from each member's own step (s23b: not identical at 8);
#  2. probe_t2w_rows.py: a Step-Audio2 DiT block over S sessions' chunks — bits per piece, and the time;
#  3. the session bench, one whole MiniCPM-o session (released dims, random weights), 20 s, graphs, with the
#     host operators' call sites (--account-sites): which of our functions issue a speaking second's ~13,900 ops;
#  4. probe_admission.py with STACKS=1 (a build stall caught with every thread's frames).
cd "$(dirname "$0")/../../.."
R=/tmp/s24; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 240 python3 docs/bench/s23/probe_group.py $R/probe-group.json > $R/probe-group.txt 2>&1
stamp "probe group, per piece (exit $?)"
timeout 150 python3 docs/bench/s23/probe_t2w_rows.py $R/probe-t2w-rows.json > $R/probe-t2w-rows.txt 2>&1
stamp "probe t2w rows (exit $?)"
timeout 300 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda --seconds 20 \
  --modes graphs --flip-seconds 0 --no-digests --account-seconds 4 --account-sites --quiet --out $R/sites \
  > $R/sites.txt 2>&1
stamp "session bench with host sites (exit $?)"
STACKS=1 timeout 240 python3 docs/bench/s22/probe_admission.py $R/probe-admission.json > $R/probe-admission.txt 2>&1
stamp "probe admission with stacks (exit $?)"
touch $R/DONE
