"""Session 23 probe, not yet run (issue 24: 8 MiniCPM-o sessions and 16 Step-Audio2 pairs both need a speaking
second's token2wav cheaper across sessions): does one Step-Audio2 DiT block over S sessions' chunks at once give
each session its own bits, which pieces refuse, and what does it save?

At the released DiT sizes (512 wide, 8 heads of 64, MLP 2,048; seeded random weights, float32), a 1 s chunk (50
frames) over a 6 s prompt (300 cached frames): each session's CFG pair is 2 rows of the batch, so S sessions are a
batch of 2S with every session's own cache and modulation. For S = 1..8:
  * each linear of block 0 alone at 2S rows against the S pairs one at a time — cuBLAS (``F.linear``) and our
    split-K kernel (``linears.linear``, whose per-row sum order does not depend on the row count by construction);
  * each conv of the block (cuDNN) at batch 2S against batch 2;
  * the whole block as production runs it (the DiT's per-length verdicts for this chunk, Triton paths eager):
    every session's output, key/value cache and conv cache against the session alone;
  * time: the block once over 2S rows against S blocks over 2 rows one after another (eager, medians of 20).
Session 24 added the vocoder: the HiFT's ``decode`` (mel + NSF source -> speech; cuDNN convs and transposed convs,
STFT/iSTFT) over S sessions' 58-frame mels at once against each alone (bits, time), and the F0 predictor likewise.
Usage: PYTHONPATH=. python3 docs/bench/s23/probe_t2w_rows.py OUT.json
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from engine.models.step_audio2 import fused as fused_kernels
from engine.models.step_audio2 import linears
from engine.models.step_audio2.config import DiTConfig
from engine.models.step_audio2.dit import DiT, Modulation

T, T0 = 50, 300
SESSIONS = tuple(int(x) for x in os.environ.get("SESSIONS", "1,2,3,4,6,8").split(","))
REPEATS = int(os.environ.get("REPEATS", "20"))


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def pairs(S, c, g, dev):
    """S sessions' block inputs: x [2S, T, C], kv [2S, h, T + T0, 2d], cnn [2S, 2C, 2], nine modulations [2S, 1, C]."""
    x = torch.randn(2 * S, T, c.hidden, generator=g).to(dev)
    kv = torch.randn(2 * S, c.heads, T + T0, 2 * c.head_dim, generator=g).to(dev)
    cnn = torch.randn(2 * S, 2 * c.hidden, 2, generator=g).to(dev)
    mods = [torch.randn(2, 1, c.hidden, generator=g).to(dev).repeat(S, 1, 1) for _ in range(9)]
    return x, kv, cnn, mods


def block(blk, x, kv, cnn, mods, fast):
    m = Modulation(mods[0:3], mods[3:6], mods[6:9])
    fused = fast["fused elementwise"]
    return blk(x, m, kv, cnn, fast["frames-major convs"], fast["parallel lanes"], fused,
               fused and fast["split-K linears"])


def per_pair(fn, x, S):
    return torch.cat([fn(x[2 * s:2 * s + 2]) for s in range(S)])


def timed(fn, k=None):
    ms = []
    for _ in range(k or REPEATS):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        ms.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(ms), 3)


def hift_rows(res, dev, path):
    """The vocoder over S sessions' chunks at once against each alone: decode (with the self-check's paths for
    this length) and the F0 predictor; bits and time."""
    from engine.models.step_audio2 import weights as W
    from engine.models.step_audio2.config import preset
    cfg = preset("released")                                 # seeded random weights, as the benches read them
    hift = W.build(cfg, W.random_state_dict(cfg, 24), dev).hift
    frames = T + 8                                           # a chunk's mel with its 8-frame overlap
    fast = hift.fast(frames)
    lanes, fused = fast["parallel lanes"], fast["fused elementwise"]
    res["hift"] = {"fast": fast, "sessions": {}}
    g = torch.Generator().manual_seed(2424)
    for S in SESSIONS:
        mel = torch.randn(S, 80, frames, generator=g).to(dev)
        src = (0.1 * torch.randn(S, 1, frames * hift.upp, generator=g)).to(dev)
        out = {}
        try:
            one = lambda m, x: hift.decode(m, x, lanes, None, fused)              # noqa: E731
            both = one(mel, src)
            alone = torch.cat([one(mel[i:i + 1], src[i:i + 1]) for i in range(S)])
            out["decode"] = bool(torch.equal(both, alone))
            out["decode max diff"] = float((both - alone).abs().max())
            f0 = hift.f0_predictor(mel)
            out["f0 predictor"] = bool(torch.equal(f0, torch.cat([hift.f0_predictor(mel[i:i + 1]) for i in range(S)])))
            out["batched ms"] = timed(lambda: one(mel, src))
            out["one by one ms"] = timed(lambda: [one(mel[i:i + 1], src[i:i + 1]) for i in range(S)])
        except Exception as e:  # noqa: BLE001 - a batch the code does not take is an answer too
            out["error"] = f"{type(e).__name__}: {e}"
        res["hift"]["sessions"][str(S)] = out
        print("hift", S, out, flush=True)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def main(path):
    dev = torch.device(os.environ.get("DEVICE", "cuda"))
    torch.manual_seed(23)
    c = DiTConfig()
    dit = DiT(c).to(dev).eval()
    fused_kernels.EAGER = True                     # the Triton paths' bits, without a capture
    blk = dit.blocks[0]
    with torch.no_grad():
        fast = dit.fast(T)
        blk.build_transposed()
        res = {"gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__, "fast": fast, "sessions": {}}
        print("paths for a", T, "frame chunk:", fast, flush=True)
        g = torch.Generator().manual_seed(2323)
        for S in SESSIONS:
            x, kv, cnn, mods = pairs(S, c, g, dev)
            out = {}
            for name, lin in (("to_q", blk.attn.to_q), ("proj", blk.attn.proj), ("fc1", blk.mlp.fc1),
                              ("fc2", blk.mlp.fc2)):
                xi = x if lin.in_features == c.hidden else torch.randn(2 * S, T, lin.in_features, generator=g).to(dev)
                out[f"cublas {name}"] = torch.equal(F.linear(xi, lin.weight, lin.bias),
                                                    per_pair(lambda a: F.linear(a, lin.weight, lin.bias), xi, S))
                if name != "fc1" and dev.type == "cuda" and linears.fits(xi, lin.weight_t) is None:
                    out[f"split-K {name}"] = torch.equal(linears.linear(xi, lin.weight_t, lin.bias),
                                                         per_pair(lambda a: linears.linear(a, lin.weight_t, lin.bias),
                                                                  xi, S))
            h = torch.randn(2 * S, c.hidden, T + 2, generator=g).to(dev)
            for i in (1, 6):
                conv = blk.conv.block[i]
                out[f"conv {i}"] = torch.equal(conv(h), per_pair(conv, h, S))
            kv_b, cnn_b = kv.clone(), cnn.clone()
            y_b = block(blk, x, kv_b, cnn_b, mods, fast)
            kv_s, cnn_s = kv.clone(), cnn.clone()
            y_s = torch.cat([block(blk, x[2 * s:2 * s + 2], kv_s[2 * s:2 * s + 2], cnn_s[2 * s:2 * s + 2],
                                   [m[2 * s:2 * s + 2] for m in mods], fast) for s in range(S)])
            out["whole block"] = bool(torch.equal(y_b, y_s) and torch.equal(kv_b, kv_s) and torch.equal(cnn_b, cnn_s))
            out["whole block max diff"] = float((y_b - y_s).abs().max())
            out["batched ms"] = timed(lambda: block(blk, x, kv.clone(), cnn.clone(), mods, fast))
            out["one by one ms"] = timed(lambda: [block(blk, x[2 * s:2 * s + 2], kv[2 * s:2 * s + 2].clone(),
                                                        cnn[2 * s:2 * s + 2].clone(), [m[2 * s:2 * s + 2] for m in mods],
                                                        fast) for s in range(S)])
            res["sessions"][str(S)] = out
            print(S, out, flush=True)
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
        hift_rows(res, dev, path)


if __name__ == "__main__":
    main(sys.argv[1])
