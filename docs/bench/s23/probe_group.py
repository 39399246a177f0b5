"""Session 23 probe (issue 24, docs/design-cross-session-llm.md): the group LLM step on the H200 at released dims.

1. ``check_rows`` for every layer linear at 1..8 rows (which GEMMs keep each row's bits when batched); session 24:
   also with one trial per weight and count, as session 23's verdicts were made, and which counts only that admits
   (a kernel that differs once in many outputs: what may have parted the 8-row step in one repeat of 15);
2. ``group_graphs.check`` at 2, 4 and 8 sessions with captured graphs (every hidden state, logit and store byte
   against each session's own captured layer graphs);
3. time: S sessions at ~800-token histories, one token each — S captured LayerGraphs replays one after another
   against one captured GroupGraphs replay, interleaved, medians of 15; where a repeat's outputs part, the first
   such repeat, its members and the first piece (layer, residual / query / attention) where each parts.
Random seeded weights (released sizes, bfloat16); SDPA's cuDNN backend off, as the backbone's build sets it (the
first run of this probe left it on: its timing's outputs differed and its own steps paid cuDNN's per-length
planning, docs/device-notes-session23.md). Usage: PYTHONPATH=. python3 docs/bench/s23/probe_group.py OUT.json
"""
import json
import statistics
import sys
import time

import torch

from engine.backbones.minicpmo45 import group_graphs as gg
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import pin_attention_kernels, seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
from engine.backbones.minicpmo45.weights import build

CAP = 1024


def stores_for(llm, d, dev, n, seed):
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 64, CAP, torch.bfloat16, "")
    g = torch.Generator().manual_seed(seed)
    pairs = []
    with torch.no_grad():
        for s in range(n):
            hist = torch.randn(700 + 37 * s, d.hidden, generator=g).to(dev, torch.bfloat16)
            a, b = make_store(True, regions[0], d.layers, CAP, dev), make_store(True, regions[0], d.layers, CAP, dev)
            for st in (a, b):
                llm(hist, st)
            pairs.append((a, b))
    return pairs


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1000


def first_piece(own, grp, m, layers):
    """Where member ``m``'s row of the group step first parts from its own step: per layer the residual stream
    in, the query, the attention output; then the final hidden state and logits."""
    for i in range(layers):
        for j, name in ((0, "residual in"), (1, "query")):
            if not torch.equal(own.outs[i][j], grp.outs[i][j].narrow(0, m, 1)):
                return f"layer {i} {name}"
        if not torch.equal(own.att[i], grp.att[i].narrow(0, m, 1)):
            return f"layer {i} attention"
    h, logits = grp.outs[-1]
    if not torch.equal(own.outs[-1][0].view(-1), h[m].view(-1)):
        return "final hidden"
    return "same" if torch.equal(own.outs[-1][1].view(-1), logits[m].view(-1)) else "logits"


def timing(llm, d, dev, n, verdicts, out):
    pairs = stores_for(llm, d, dev, n, 500 + n)
    own = [LayerGraphs(llm, a, dev, capture=True) for a, _ in pairs]
    grp = gg.GroupGraphs(llm, [b for _, b in pairs], dev, verdicts, capture=True)
    g = torch.Generator(device=dev).manual_seed(n)
    solo_ms, group_ms, same, first = [], [], True, None
    with torch.no_grad():
        for rep in range(15):
            rows = torch.randn(n, d.hidden, generator=g, device=dev).to(torch.bfloat16)
            res = []
            solo_ms.append(timed(lambda: res.extend(o.forward(rows[s:s + 1]) for s, o in enumerate(own))))
            got = []
            group_ms.append(timed(lambda: got.extend(grp.forward(rows))))
            ok = [torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(res, got)]
            if first is None and not all(ok):     # the first repeat that parts (later ones carry its keys)
                first = {"repeat": rep, "members": [m for m, k in enumerate(ok) if not k],
                         "pieces": {m: first_piece(own[m], grp, m, d.layers) for m, k in enumerate(ok) if not k},
                         "positions": [p.length - 1 for _, p in pairs]}
            same = same and all(ok)
    s, gm = statistics.median(solo_ms), statistics.median(group_ms)
    out[str(n)] = {"solo_ms_median": round(s, 3), "group_ms_median": round(gm, 3), "ratio": round(s / gm, 3),
                   "identical_every_repeat": same, "first_difference": first}
    if first is not None:
        print(f"  first difference at {n}: {first}", flush=True)
    print(f"{n} sessions: {n} own steps {s:.2f} ms, one group step {gm:.2f} ms ({s / gm:.2f}x), identical {same}",
          flush=True)
    del own, grp, pairs
    torch.cuda.empty_cache()


def main(path):
    dev = torch.device("cuda")
    pin_attention_kernels(dev)          # as the backbone's build does (cuDNN attention does not repeat its bits)
    d = preset("released").llm
    t0 = time.time()
    llm = build(Qwen3, d, device=dev, dtype=torch.bfloat16).eval()
    seeded_init(llm, 2323)
    print(f"LLM built in {time.time() - t0:.1f} s", flush=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    strict = gg.ROW_CHECK_ELEMENTS
    gg.ROW_CHECK_ELEMENTS = 1                       # session 23's verdicts: one trial per weight and count
    one = gg.check_rows(llm, range(1, 9), seed=23)
    gg.ROW_CHECK_ELEMENTS = strict
    t1 = time.time()
    verdicts = gg.check_rows(llm, range(1, 9), seed=23)
    res["verdicts_s"] = round(time.time() - t1, 2)
    res["verdicts"] = {k: sorted(v) for k, v in verdicts.items()}
    res["verdicts_one_trial"] = {k: sorted(v) for k, v in one.items()}
    res["admitted_by_one_trial_only"] = {k: sorted(one[k] - verdicts[k]) for k in one if one[k] - verdicts[k]}
    print("row verdicts:", res["verdicts"], f"({res['verdicts_s']} s)", flush=True)
    print("admitted by one trial, refused by 2^21 outputs:", res["admitted_by_one_trial_only"], flush=True)
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 64, 256, torch.bfloat16, "")
    res["check"] = {}
    for n in (2, 4, 8):
        ok, why = gg.check(llm, lambda: make_store(True, regions[0], d.layers, 256, dev), dev, n, verdicts,
                           graphs=True, seed=n)
        res["check"][str(n)] = {"ok": ok, "why": why}
        print(f"check {n}: {ok} — {why}", flush=True)
        torch.cuda.empty_cache()
    res["timing"] = {}
    for n in (2, 4, 6, 7, 8):
        timing(llm, d, dev, n, verdicts, res["timing"])
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    res["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
