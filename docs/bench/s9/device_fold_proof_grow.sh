#!/bin/bash
# session 9, call 3: (1) the TTS code head folded on the CPU vs on CUDA at released dims (the suspected cause of
# call 1's TTS-logit differences), (2) the grow-ahead GPU test seeded as its CPU twin, and the head-fold GPU test, (3) issue 21's released proof again
# (60 s, flipped) with the head folded on the model's device.
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
source docs/bench/s6/device_stock_env.sh
t0=$(date +%s)
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -s -rs tests/test_minicpmo45_gpu.py -k "grows_ahead or folded" > $OUT/gpu-two.txt 2>&1
echo "exit $?" >> $OUT/gpu-two.txt; grep -E "passed|failed|^E |exit|fold on" $OUT/gpu-two.txt | cut -c1-250
python3 tests/minicpmo45_stock_folder.py /tmp/mc-released --size released > $OUT/released-folder.txt 2>&1
echo "folder written after $(( $(date +%s) - t0 )) s"
python3 - <<'PY' 2>&1 | tee $OUT/fold.txt
import torch
from engine.backbones.minicpmo45 import weights as W
f = W.open_folder("/tmp/mc-released"); sh = W._Shards(f, "cpu")
base = "tts.head_code.0"
keys = [k for k in f.weight_map if k.startswith(base)]
print("head keys", keys)
g = sh.get(next(k for k in keys if k.endswith(("original0", "weight_g")))); v = sh.get(next(k for k in keys if k.endswith(("original1", "weight_v"))))
cpu = W.fold_weight_norm(g, v, torch.bfloat16)
gpu = W.fold_weight_norm(g, v, torch.bfloat16, "cuda").cpu()
d = (cpu.float() - gpu.float()).abs()
print("fold cpu vs cuda:", tuple(cpu.shape), "equal", torch.equal(cpu, gpu), "differing elements", int((d > 0).sum()), "rows", int((d.amax(1) > 0).sum()), "max", float(d.max()))
PY
export DC_STOCK_REPORT=$OUT/released-report.json DC_STOCK_FOLDER=/tmp/mc-released DC_STOCK_SECONDS=${DC_STOCK_SECONDS:-60}
left=$(( 560 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/test_minicpmo45_stock_loop_gpu.py -k "${DC_MODES:-flipped}" > $OUT/released.txt 2>&1
echo "exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/released.txt; tail -c 600 $OUT/released.txt; head -c 800 $OUT/released-report.json 2>/dev/null; echo
