#!/bin/bash
# session 13, call 2 (issue 23's memory and p99): every runtime now warms up and captures on one capture stream per
# device (session 13 call 1's map: 1.7 GB held on 13 pooled side streams, 1.4 GB in dead self-check graph pools), the
# self-checks and the build end by giving the allocator's free blocks back, and our stock-loop row's peak counts the
# build. GPU tests of the core (captures beside other threads' draws), the host (whole sessions starting and stopping)
# and the memory map; then the stock-loop rows with the per-second accounting and our per-second records.
# Predicted: tests pass; ours' peak ~20.0-20.4 GB (stock 20,734 MiB), the side streams' group under 0.2 GB, speaking
# ~205 ms; the records name the p99 second (call 1: 558 ms, a speaking second) and its stage.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -s -rs tests/test_core_gpu.py tests/test_host_gpu.py \
  tests/test_memory_map.py > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED|during another|while B|capture stream" $OUT/gpu-tests.txt | cut -c1-300 | tail -14
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( ${DC_WALL:-470} - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds ${DC_SECONDS:-24} --modes graphs --account-seconds 4 --stock-loop /tmp/vs/python \
  --stock-loop-folder /tmp/mc-released --stock-loop-modes eager --stock-loop-repeats 1 --quiet \
  --out $OUT/stock-rows > $OUT/stock-rows.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/stock-rows.txt; grep -v Warning $OUT/stock-rows.txt | tail -44
python3 - $OUT/stock-rows/session-graphs-1.csv <<'P' 2>&1 | tail -26
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["index"], r["decision"], *(f"{float(r[k]):7.1f}" for k in ("total_ms", "listen_ms", "think_ms", "speak_ms")),
          f"{int(r['reserved_bytes']) / 2**20:9.0f} MiB")
P
