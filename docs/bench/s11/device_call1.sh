#!/bin/bash
# session 11, call 1: the replay-once probe (issue 23), then issue 24's capacity bench for whole MiniCPM-o 4.5
# sessions (ours, optimized, threads), never run since the crash of 3 sessions and the capture gate's collector fix.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 90 python3 docs/bench/s10/probe_replay_once.py $OUT/replay-once.json > $OUT/replay-once.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/replay-once.txt; tail -12 $OUT/replay-once.txt
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( 585 - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli capacity --tail step-audio2 --backbone minicpm-o-4.5 --size released \
  --device cuda --seconds 60 --max-sessions 8 --modes optimized --window 8 --time-limit $(( left - 15 )) \
  --solo-sessions 2 --solo-seconds 10 --json $OUT/capacity-minicpmo.json > $OUT/capacity-minicpmo.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/capacity-minicpmo.txt
grep -v Warning $OUT/capacity-minicpmo.txt | tail -40
nvidia-smi --query-gpu=memory.used --format=csv > $OUT/smi.txt 2>&1
