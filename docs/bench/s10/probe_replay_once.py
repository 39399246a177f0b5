"""Session 10's open question, for the next H200 call: does a CUDA graph replayed only once cost more than the
work it replaces? Released TTS (20 x 768), a reply past its prepared room: for 45 lengths, time (a) the
between-attention path (LayerGraphs: 21 graphs + 20 eager attention calls), (b) the capture of a per-length
graph (warm-up included), (c) its first replay and (d) a second replay of the same graph. Each timed with a
device synchronize before and after (host wall, ms). Prints medians and writes JSON to $OUT or argv[1].

    PYTHONPATH=. python3 docs/bench/s10/probe_replay_once.py $OUT/replay-once.json
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import pin_attention_kernels, seeded_init
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
from engine.backbones.minicpmo45.tts import TTS, DecodeGraphs
from engine.backbones.minicpmo45.weights import build


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0


def main(out: str) -> None:
    pin_attention_kernels("cuda")
    d = preset("released")
    tts = build(TTS, d.tts, d.llm, device="cuda", dtype=torch.bfloat16).eval()
    seeded_init(tts, 4)
    regions = kv_regions("tts", d.tts.layers, d.tts.kv_heads, d.tts.head_dim, 45, d.tts.max_positions,
                         torch.bfloat16, "")
    kv = make_store(True, regions[0], d.tts.layers, 600, "cuda")
    dg = DecodeGraphs(tts, torch.device("cuda"), recurring=200)
    code = torch.zeros(1, dtype=torch.long, device="cuda")
    res = {"layered": [], "capture": [], "first_replay": [], "second_replay": []}
    with torch.no_grad():
        layered = LayerGraphs(tts, kv, torch.device("cuda"), capture=True, head=tts.head_code[0])
        kv.length = 300
        for n in range(301, 346):
            emb = tts.emb_code[0](code)
            kv.length = n - 1
            res["layered"].append(timed(lambda: layered.forward(emb)))
            kv.length = n - 1
            res["capture"].append(timed(lambda: dg.capture(kv, n, warm=True)))
            g = dg.graphs[n][0]
            res["first_replay"].append(timed(lambda: dg.runtime.replay(g)))
            res["second_replay"].append(timed(lambda: dg.runtime.replay(g)))
    summary = {k: round(statistics.median(v), 3) for k, v in res.items()}
    print("medians over 45 lengths, ms:", summary)
    with open(out, "w") as f:
        json.dump({"medians_ms": summary, "samples_ms": res, "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "replay-once.json"))
