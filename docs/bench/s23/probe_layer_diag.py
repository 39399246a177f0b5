"""Session 23 probe (issue 24): which piece of a captured one-token step parts from the same code run eagerly.

probe_group_diag.py found a session's own captured layer graphs (and the captured group step) differing from the
eager forward at some history lengths (first differing key at layer 7-24), while the eager group step matched.
Here, for one session at many history lengths: (a) LayerGraphs captured, (a2) captured again on a second copy
(is the replay deterministic?), (e) the same LayerGraphs segments run eagerly; per layer, the residual stream,
the query and the attention output of (a) against (e) — the first one that differs names the kernel. Then the
own step's time split: the 37 replays alone against the 36 eager attention calls alone.
With NO_CUDNN=1 the process runs with SDPA's cuDNN backend off (the first run found one-query SDPA on cuDNN: two
captures of one step on identical inputs differed, and a new history length cost ~0.9 ms of planning per call);
it also compares SDPA over the grouped heads (enable_gqa) with the widened path at lengths up to 4,096.
Usage: [NO_CUDNN=1] PYTHONPATH=. python3 docs/bench/s23/probe_layer_diag.py OUT.json
"""
import json
import os
import statistics
import sys
import time

import torch

from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
from engine.backbones.minicpmo45.weights import build

CAP = 1280
LENGTHS = (511, 512, 549, 600, 601, 650, 700, 750, 800, 900, 1000, 1001, 1100)


def first_piece(x, y, layers):
    for i in range(layers):
        for j, name in ((0, "residual in"), (1, "query")):
            if j < len(x.outs[i]) and not torch.equal(x.outs[i][j], y.outs[i][j]):
                return f"layer {i} {name}"
        if not torch.equal(x.att[i], y.att[i]):
            return f"layer {i} attention"
    return "same" if torch.equal(x.outs[-1][1], y.outs[-1][1]) else "final"


def one(llm, d, dev, L):
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 64, CAP, torch.bfloat16, "")
    g = torch.Generator().manual_seed(L)
    hist = torch.randn(L, d.hidden, generator=g).to(dev, torch.bfloat16)
    row = torch.randn(1, d.hidden, generator=g).to(dev, torch.bfloat16)
    out = {}
    with torch.no_grad():
        stores = []
        for _ in range(3):
            st = make_store(True, regions[0], d.layers, CAP, dev)
            llm(hist, st)
            stores.append(st)
        a = LayerGraphs(llm, stores[0], dev, capture=True)
        a2 = LayerGraphs(llm, stores[1], dev, capture=True)
        e = LayerGraphs(llm, stores[2], dev, capture=False)
        ha, la = a.forward(row)
        ha2, la2 = a2.forward(row)
        he, le = e.forward(row)
        out["a_vs_a2"] = bool(torch.equal(ha, ha2) and torch.equal(la, la2))
        out["a_vs_e"] = bool(torch.equal(ha, he) and torch.equal(la, le))
        out["first_piece"] = first_piece(a, e, d.layers)
        # the same step again on the (a) graphs with the (e) inputs: is the attention itself repeatable?
    return out


def split_time(llm, d, dev):
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 64, CAP, torch.bfloat16, "")
    st = make_store(True, regions[0], d.layers, CAP, dev)
    with torch.no_grad():
        llm(torch.randn(700, d.hidden, device=dev).to(torch.bfloat16), st)
        a = LayerGraphs(llm, st, dev, capture=True)
        row = torch.randn(1, d.hidden, device=dev).to(torch.bfloat16)
        a.forward(row)
        def t(fn, k=10):
            ms = []
            for _ in range(k):
                torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); torch.cuda.synchronize()
                ms.append((time.perf_counter() - t0) * 1000)
            return round(statistics.median(ms), 3)
        n = st.length
        whole = t(lambda: a.forward(row))
        replays = t(lambda: [g.replay() for g in a.graphs])
        attn = t(lambda: [a.attend.into(s, a.outs[s][1], n, None, a.att[s]) for s in range(d.layers)])
        one_attn = t(lambda: a.attend(0, a.outs[0][1], n, None))
    return {"whole_ms": whole, "replays_ms": replays, "attention_ms": attn, "one_attention_ms": one_attn,
            "sdp_flash": torch.backends.cuda.flash_sdp_enabled(), "sdp_mem": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "sdp_cudnn": torch.backends.cuda.cudnn_sdp_enabled(), "sdp_math": torch.backends.cuda.math_sdp_enabled()}


def gqa_lengths(dev):
    """SDPA over 8 key/value heads as they are (enable_gqa) against the widened 32, one query, fresh inputs."""
    from engine.backbones.minicpmo45 import gqa
    g = torch.Generator(device=dev).manual_seed(7)
    bad = []
    for n in (63, 64, 65, 511, 512, 513, 1000, 1024, 1500, 2047, 2048, 2600, 3000, 4095, 4096):
        q = torch.randn(1, 32, 1, 128, generator=g, device=dev).to(torch.bfloat16)
        k = torch.randn(1, 8, n, 128, generator=g, device=dev).to(torch.bfloat16)
        v = torch.randn(1, 8, n, 128, generator=g, device=dev).to(torch.bfloat16)
        w1, w2 = gqa.widened(q, k, v, 4), gqa.widened(q, k, v, 4)
        if not torch.equal(w1, w2):
            bad.append(f"{n}: widened twice differs")
        if not torch.equal(gqa.grouped(q, k, v), w1):
            bad.append(f"{n}: grouped differs")
    return bad


def main(path):
    dev = torch.device("cuda")
    if os.environ.get("NO_CUDNN") == "1":
        torch.backends.cuda.enable_cudnn_sdp(False)
    d = preset("released").llm
    llm = build(Qwen3, d, device=dev, dtype=torch.bfloat16).eval()
    seeded_init(llm, 2323)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "lengths": {}}
    res["gqa_mismatches"] = gqa_lengths(dev)
    print("gqa:", res["gqa_mismatches"], flush=True)
    res["time"] = split_time(llm, d, dev)
    print("time:", res["time"], flush=True)
    for L in LENGTHS:
        res["lengths"][str(L)] = one(llm, d, dev, L)
        print(L, res["lengths"][str(L)], flush=True)
        torch.cuda.empty_cache()
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    # which SDPA kernel runs the one-query attention: profile one call
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        q = torch.randn(1, 32, 1, 128, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, 32, 700, 128, device=dev, dtype=torch.bfloat16)
        torch.nn.functional.scaled_dot_product_attention(q, k, k)
        torch.cuda.synchronize()
    res["sdpa_kernels"] = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})[:20]
    print("sdpa kernels:", res["sdpa_kernels"], flush=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
