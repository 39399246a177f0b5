"""Session 21 probe (issue 24, docs/design-cross-session-llm.md "Bits" item 2): do the LLM step's non-GEMM
pieces keep each session's bits when r sessions' one-token rows run together, on this GPU?

At the released LLM sizes (hidden 4,096; 32 query / 8 key-value heads of 128) with fresh N(0, 1) bfloat16 rows
and positions drawn apart (each session at its own length), for r = 2..8, 16, 32, each against the row alone:
the stock RMSNorm chain over the hidden rows, the per-head q norm over [r, 1, 32, 128], the stock RoPE with each
row's own cos/sin, SiLU(gate) * up, and the residual add. Prints which are `torch.equal` at which r.
Usage: PYTHONPATH=. python3 docs/bench/s21/probe_norms.py OUT.json
"""
import json
import sys

import torch
import torch.nn.functional as F

from engine.backbones.minicpmo45.layers import apply_rope_stock, rms_norm_stock, rope_tables

ROWS = [2, 3, 4, 5, 6, 7, 8, 16, 32]


def pieces(dev, g):
    w = (1 + 0.1 * torch.randn(4096, generator=g, device=dev)).to(torch.bfloat16)
    wq = (1 + 0.1 * torch.randn(128, generator=g, device=dev)).to(torch.bfloat16)
    return {
        "rms_norm hidden": lambda x: rms_norm_stock(x["h"], w, 1e-6),
        "q norm per head": lambda x: rms_norm_stock(x["q"], wq, 1e-6),
        "rope per row": lambda x: apply_rope_stock(x["qt"], x["cos"], x["sin"]),
        "silu(gate) * up": lambda x: F.silu(x["g"]) * x["u"],
        "residual add": lambda x: x["h"] + x["o"],
    }


def inputs(r, dev, g):
    bf = torch.bfloat16
    pos = torch.randint(0, 4000, (r,), generator=g, device=dev)
    cos, sin = rope_tables(pos, 128, 1_000_000.0, bf)                  # [r, 128]
    return {"h": torch.randn(r, 1, 4096, generator=g, device=dev).to(bf),
            "o": torch.randn(r, 1, 4096, generator=g, device=dev).to(bf),
            "q": torch.randn(r, 1, 32, 128, generator=g, device=dev).to(bf),
            "qt": torch.randn(r, 32, 1, 128, generator=g, device=dev).to(bf),
            "cos": cos[:, None, None, :], "sin": sin[:, None, None, :],
            "g": torch.randn(r, 1, 12288, generator=g, device=dev).to(bf),
            "u": torch.randn(r, 1, 12288, generator=g, device=dev).to(bf)}


def row(x, i):
    return {k: v[i:i + 1] for k, v in x.items()}


def main(path):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(2121)
    fns = pieces(dev, g)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "pieces": {}}
    for name, fn in fns.items():
        ok = []
        for r in ROWS:
            x = inputs(r, dev, g)
            alone = torch.cat([fn(row(x, i)) for i in range(r)])
            ok.append(r) if torch.equal(fn(x), alone) else None
        out["pieces"][name] = ok
        print(f"{name:18s} equal at {ok}", flush=True)
    json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
