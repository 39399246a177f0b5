#!/bin/bash
# Prepared in sessions 23-24 for the next device time (`DC_WALL=570 bash .snap/docs/bench/device_bg.sh
# docs/bench/s24/bg.sh start`, then the same without `start` until ALL-DONE; carry .snap (HEAD without docs/ +
# docs/bench/device_bg.sh, s6, s22, s23, s24) and .whl; the archive is s24.tar.gz). Most valuable first; the whole
# list is ~1,900 s, more than one session's device time: what does not run waits for the next.
#  1. the GPU tests of LLM rounds (members on their own streams, store moves, an absent member growing its store;
#     4 tiny whole MiniCPM-o sessions in rounds, each identical to solo);
#  2. probe_connections.py: 1-16 sessions' token2wav replays at 8 vs 32 CUDA work queues (bits across settings);
#     its BEST count goes to every capacity run below (--cuda-connections);
#  3. capacity --modes rounds, 8 built before fed, released dims (groups of 4: the size proven over long histories);
#  4. the Step-Audio2 pairs at 16 (issue 24 asks 16; session 22: 20 of 960 late at 8 queues, 5 ms switch interval);
#  5. probe_t2w_rows.py: a Step-Audio2 DiT block and the HiFT over S sessions' chunks (bits per piece, time);
#  6. the session bench, one MiniCPM-o session (released dims), with the host operators' call sites;
#  7. probe_group.py: where the 8-row group step parts from each member's own step (s23b: not identical at 8);
#  8. probe_admission.py with STACKS=1 (a build stall caught with every thread's frames).
cd "$(dirname "$0")/../../.."
R=/tmp/s24; mkdir -p $R; export OUT=$R
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=. PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "$1 done after $(( $(date +%s) - t0 )) s" >> $R/steps.txt; }
timeout 300 python3 -m pytest -q -m gpu -s tests/test_minicpmo45_rounds_gpu.py tests/test_host_gpu.py \
  -k "llm_rounds or own_streams or absent_member" > $R/gpu-rounds.txt 2>&1
stamp "gpu tests, llm rounds (exit $?)"
SETTINGS=8,32 timeout 300 python3 docs/bench/s24/probe_connections.py $R/probe-connections.json \
  > $R/probe-connections.txt 2>&1
stamp "probe connections (exit $?)"
Q=$(awk '/^BEST/ {print $2}' $R/probe-connections.txt); Q=${Q:-8}; echo "queues chosen: $Q" >> $R/steps.txt
timeout 480 python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --seconds 60 --max-sessions 8 --start 8 --modes rounds --batch-slots 4 --window 6 --time-limit 450 \
  --confirm-tries 2 --solo-sessions 2 --solo-seconds 6 --switch-interval 1 --cuda-connections $Q \
  --json $R/capacity-rounds.json > $R/capacity-rounds.txt 2>&1
stamp "capacity, llm rounds (exit $?)"
timeout 360 python3 -m engine.bench.cli capacity --tail step-audio2 --size released --device cuda --seconds 60 \
  --max-sessions 16 --start 16 --modes optimized --window 3 --time-limit 340 --confirm-tries 1 --solo-sessions 1 \
  --solo-seconds 6 --switch-interval 1 --cuda-connections $Q --json $R/cap_step_audio2.json > $R/cap_step_audio2.txt 2>&1
stamp "capacity, step-audio2 pairs at 16 (exit $?)"
timeout 200 python3 docs/bench/s23/probe_t2w_rows.py $R/probe-t2w-rows.json > $R/probe-t2w-rows.txt 2>&1
stamp "probe t2w rows (exit $?)"
timeout 240 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda --seconds 12 \
  --modes graphs --flip-seconds 0 --no-digests --account-seconds 4 --account-sites --quiet --out $R/sites \
  > $R/sites.txt 2>&1
stamp "session bench with host sites (exit $?)"
timeout 240 python3 docs/bench/s23/probe_group.py $R/probe-group.json > $R/probe-group.txt 2>&1
stamp "probe group, per piece (exit $?)"
STACKS=1 timeout 240 python3 docs/bench/s22/probe_admission.py $R/probe-admission.json > $R/probe-admission.txt 2>&1
stamp "probe admission with stacks (exit $?)"
touch $R/DONE
