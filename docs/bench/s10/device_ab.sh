#!/bin/bash
# session 10, last call: the GPU tests of the ahead path (with captures now shielded from the garbage collector),
# then the model-policy session A/B on the released folder: ahead off vs ahead "listen" (LISTEN's forwards and
# THINK's first slot captured between seconds), 24 s each, no profiler, no digests.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_gpu.py -k "ahead or exact" > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt; tail -3 $OUT/gpu-tests.txt
for ahead in off listen; do
  left=$(( 300 - ($(date +%s) - t0) ))
  [ $left -gt 40 ] || break
  timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
    --backbone-checkpoint /tmp/mc-released --voice /tmp/mc-released/voice.npz --seconds ${DC_SECONDS:-24} --modes graphs \
    --flip-seconds 0 --account-seconds 0 --no-digests --ahead $ahead --quiet --out $OUT/ab-$ahead > $OUT/ab-$ahead.txt 2>&1
  echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/ab-$ahead.txt; grep -v Warning $OUT/ab-$ahead.txt | grep -A4 "mean ms" | head -5; tail -1 $OUT/ab-$ahead.txt
done
