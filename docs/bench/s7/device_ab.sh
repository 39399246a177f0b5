#!/bin/bash
# next session (issue 23): do session 6's CUDA-parity changes cost host time? Session 6's commit (03dd3f1, in
# .snap/old: `git archive 03dd3f1 | tar -x -C .snap/old`) and HEAD, 30 s of the MiniCPM-o graphs bench each,
# interleaved old/new/old/new on one machine; per-run means of speaking and listening seconds. HEAD's second run
# also accounts 4 seconds (after its main run): where a speaking second's kernel time goes, by kernel.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl 2>&1 | grep -v WARNING | tail -1
for round in 1 2; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=$PWD/old
    acc="--account-seconds 0"; [ $side$round = new2 ] && acc="--account-seconds 4"
    (cd "$dir" && PYTHONPATH=.:../.oracle:../../.oracle timeout 140 python3 -m engine.bench.cli session \
      --backbone minicpm-o-4.5 --size released --device cuda --seconds 30 --modes graphs --flip-seconds 0 $acc \
      --quiet --out $OUT/ab-$side-$round > $OUT/ab-$side-$round.txt 2>&1; echo "exit $?" >> $OUT/ab-$side-$round.txt)
    python3 - "$OUT/ab-$side-$round/bench.json" "$side $round" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
g = d["modes"]["graphs"]
print(sys.argv[2], {k: round(g[k], 1) for k in ("mean_speaking_second_ms", "mean_listening_second_ms",
                                                "mean_think_ms_speaking", "mean_listen_ms_speaking", "p99_total_ms")})
PY
  done
done
sed -n '/kernel (summed/,/^$/p' $OUT/ab-new-2.txt | head -40
