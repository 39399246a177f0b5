#!/bin/bash
# session 15, call 3 (the last of the session's budget): the codes-ahead GPU test isolated (call 1's failure:
# against the *stock* store the checked loop drew another code at step 3 on CUDA; now both loops run over the same
# demand store), a diagnostic of that difference, then ours alone for 60 s with --ahead all: the TTS's per-length
# decode graphs past a reply's prepared room (4 s) captured between seconds, off the clock.
# Predicted: the isolated test passes (the ahead loop is the checked loop's bits); the diagnostic shows the stock
# and demand stores' checked loops apart on CUDA at step 3; with --ahead all the long reply's TTS part stays near
# 42 ms past second 8 (call 1: ~57-60), mean speaking ~150 ms, ahead ~150-300 ms per second off the clock.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_codes_ahead.py > $OUT/gpu-tests.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/gpu-tests.txt
grep -E "passed|failed|^E |exit|^FAILED" $OUT/gpu-tests.txt | cut -c1-300 | tail -8
timeout 40 python3 - <<'P' > $OUT/store-diagnostic.txt 2>&1
import pytest, torch, sys
sys.path.insert(0, "tests")
import test_minicpmo45_codes_ahead as T
mp = pytest.MonkeyPatch()
stock = T._speak(False, 3, 0, False, mp, "cuda")
demand = T._speak_checked(3, 0, False, mp, "cuda")
ahead = T._speak(True, 3, 0, False, mp, "cuda")
print("checked, stock store :", stock[0])
print("checked, demand store:", demand[0])
print("ahead,   demand store:", ahead[0])
for i, ((sa, a), (sb, b)) in enumerate(zip(stock[4], demand[4])):
    if not torch.equal(a, b):
        print("first tap apart:", i, sa, "max abs diff", (a.float() - b.float()).abs().max().item()); break
P
cat $OUT/store-diagnostic.txt | tail -6
released_folder
echo "folder ready after $(( $(date +%s) - t0 )) s"
left=$(( ${DC_WALL:-330} - ($(date +%s) - t0) ))
timeout $left python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda \
  --seconds 60 --modes graphs --ahead all --account-seconds 0 --flip-seconds 0 --no-digests --quiet \
  --out $OUT/ours-ahead > $OUT/ours-ahead.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/ours-ahead.txt; grep -v Warning $OUT/ours-ahead.txt | tail -24
python3 - $OUT/ours-ahead/session-graphs.csv <<'P' 2>&1 | head -64
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(r["index"], r["decision"], *(f"{float(r[k]):7.1f}" for k in ("total_ms", "listen_ms", "think_ms", "think_tts_ms", "speak_ms", "ahead_ms")), r["ahead_captures"])
P
