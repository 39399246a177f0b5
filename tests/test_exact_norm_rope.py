"""The exact fused RMSNorm/RoPE (engine/kernels): the stock chains' bits in fewer kernels.

On the CPU Triton's interpreter runs the kernels themselves (a subprocess: TRITON_INTERPRET must be set before
Triton is imported): every output ``torch.equal`` to the stock chain over bfloat16 rows scaled 1e-3 .. 1e3, ties
of the rounding to bfloat16 (a product of two bfloat16 values often lands exactly between two), zeros, overflow,
both head layouts and one and several positions; then a tiny MiniCPM-o LLM and TTS forward with the fused kernels
taken everywhere equal to the stock forward. Where the kernels run (inside captures, on a device whose check chose
them) and the verdict's wording are checked without Triton. The GPU check and the captured graphs are
tests/test_exact_norm_rope_gpu.py.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import oracles

from engine import fastpath
from engine.backbones.minicpmo45.layers import apply_rope_stock, rms_norm_stock
from engine.kernels import exact, norm_rope

ROOT = Path(__file__).resolve().parents[1]

KERNEL_SCRIPT = r"""
import torch
from engine.backbones.minicpmo45.layers import apply_rope_stock, rms_norm_stock
from engine.kernels import norm_rope
g = torch.Generator().manual_seed(int(__import__("sys").argv[1]))
bf = torch.bfloat16

def rows(*shape):
    x = torch.randn(*shape, generator=g) * torch.pow(10.0, torch.empty(*shape[:-1], 1).uniform_(-3, 3, generator=g))
    return x.to(bf)

checked = 0
for shape, eps in (((1, 1, 64), 1e-6), ((1, 11, 4096), 1e-6), ((1, 3, 32, 128), 1e-6), ((1, 1, 8, 128), 1e-6),
                   ((1, 5, 768), 1e-5), ((4096, 128), 1e-6)):
    x, w = rows(*shape), rows(shape[-1])
    x.view(-1, shape[-1])[0] = 0                                   # a zero row: rsqrt(eps)
    if x.numel() // shape[-1] > 2:
        x.view(-1, shape[-1])[1, :2] = 3.0e38                       # squares overflow: var inf, the row 0
    assert norm_rope.rms_norm_fits(x, w)
    ref, ours = rms_norm_stock(x, w, eps), norm_rope.rms_norm(x, w, eps)
    assert torch.equal(ref, ours) and ref.stride() == ours.stride(), ("norm", shape)
    checked += ref.numel()
for h, t, hd in ((32, 1, 128), (8, 1, 128), (32, 11, 128), (12, 1, 64), (12, 7, 64), (4, 2, 16)):
    x = rows(1, t, h, hd).transpose(1, 2)                          # [1, H, T, hd], the projections' view
    cos, sin = rows(t, hd), rows(t, hd)
    assert norm_rope.rope_fits(x, cos, sin)
    ref, ours = apply_rope_stock(x, cos, sin), norm_rope.rope(x, cos, sin)
    assert torch.equal(ref, ours) and ref.stride() == ours.stride(), ("rope", h, t, hd, ref.stride(), ours.stride())
    checked += ref.numel()
for t, h, hd in ((1, 32, 128), (1, 8, 128), (11, 32, 128), (3, 4, 16)):
    x, w = rows(1, t, h, hd), rows(hd)                             # a projection's heads: q/k norm, then RoPE
    cos, sin = rows(t, hd), rows(t, hd)
    assert norm_rope.rms_norm_rope_fits(x, w, cos, sin)
    ref = apply_rope_stock(rms_norm_stock(x, w, 1e-6).transpose(1, 2), cos, sin)
    ours = norm_rope.rms_norm_rope(x, w, 1e-6, cos, sin)
    assert torch.equal(ref, ours) and ref.stride() == ours.stride(), ("norm+rope", t, h, hd)
    checked += ref.numel()
print("KERNELS-OK", checked)
"""

MODEL_SCRIPT = r"""
import dataclasses, torch
from engine.backbones.minicpmo45 import weights as W
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
from engine.kernels import exact, norm_rope
bf = torch.bfloat16
d = dataclasses.replace(preset("tiny").llm, head_dim=16)
llm = W.build(Qwen3, d, device="cpu", dtype=bf).eval()
seeded_init(llm, 9)
calls = {"norm": 0, "rope": 0, "both": 0}
for name, key in (("rms_norm", "norm"), ("rope", "rope"), ("rms_norm_rope", "both")):
    real = getattr(norm_rope, name)
    def counted(*a, _real=real, _key=key):
        calls[_key] += 1
        return _real(*a)
    setattr(norm_rope, name, counted)
regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 33, d.max_positions, bf, "")
outs = []
for fused in (False, True):
    exact.use_fused = (lambda x: True) if fused else (lambda x: False)
    kv = make_store(True, regions[0], d.layers, 64, "cpu")
    one, two = (LayerGraphs(llm, kv, torch.device("cpu"), capture=False, tokens=t) for t in (1, 2))
    g = torch.Generator().manual_seed(4)
    got = []
    with torch.no_grad():
        for t in (11, 1, 2, 1, 1, 2, 1):
            x = torch.randn(t, d.hidden, generator=g).to(bf)
            got += list(one.forward(x)) if t == 1 else [two.forward(x)[0]] if t == 2 else [llm(x, kv)]
    outs.append(got + [kv.k_buf[:, :, :kv.length].clone(), kv.v_buf[:, :, :kv.length].clone()])
assert calls["norm"] > 0 and calls["both"] > 0, calls          # Qwen3: every RoPE follows its q/k norm
assert len(outs[0]) == len(outs[1]) and all(torch.equal(a, b) for a, b in zip(*outs)), "fused forward differs"
print("MODEL-OK", calls)
"""


def _interpreted(script: str, *args: str) -> str:
    oracles.require(oracles.TRITON)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.bits
@pytest.mark.parametrize("seed", [11, 12])
def test_the_kernels_give_the_stock_chains_bits(seed):
    out = _interpreted(KERNEL_SCRIPT, str(seed))
    assert "KERNELS-OK" in out and int(out.split()[-1]) > 690_000, out


@pytest.mark.bits
def test_a_tiny_llm_with_the_fused_kernels_everywhere_gives_the_stock_bits():
    """Every RMSNorm and RoPE of a bfloat16 Qwen3 forward (prefill, one token, a two-wide feed; layer segments
    and the eager stack) through the kernels: hidden states, logits and the stored keys and values unchanged."""
    assert "MODEL-OK" in _interpreted(MODEL_SCRIPT)


def test_the_fused_kernels_run_only_inside_captures_on_a_checked_device(monkeypatch):
    x = torch.zeros(2, 4, dtype=torch.bfloat16)
    exact.forget()
    assert not exact.use_fused(x)                           # nothing checked: the stock chains
    monkeypatch.setitem(exact._chosen, None, True)
    assert not exact.use_fused(x)                           # a CPU tensor never takes them (no capture there)
    exact.forget()


def test_the_cpu_verdict_says_why_not():
    v = exact.prepare("cpu", "tiny", [((1, 1, 8), 1e-6)], [(2, 1, 8)], rms_norm_stock, apply_rope_stock)
    assert not v.chosen and "CPU captures no graphs" in v.line()


def test_shapes_the_kernels_do_not_take_run_the_stock_chains():
    bf = torch.bfloat16
    x, w = torch.zeros(1, 3, 8, dtype=bf), torch.ones(8, dtype=bf)
    assert norm_rope.rms_norm_fits(x, w)
    assert not norm_rope.rms_norm_fits(x.float(), w.float())                       # float32 models
    assert not norm_rope.rms_norm_fits(x.transpose(1, 2).transpose(1, 2)[:, :, :4], w[:4])   # not contiguous
    assert not norm_rope.rms_norm_fits(x, torch.ones(4, dtype=bf))
    q, c = torch.zeros(1, 3, 2, 8, dtype=bf).transpose(1, 2), torch.zeros(3, 8, dtype=bf)
    assert norm_rope.rope_fits(q, c, c)
    assert not norm_rope.rope_fits(torch.zeros(1, 2, 3, 6, dtype=bf), torch.zeros(3, 6, dtype=bf),
                                   torch.zeros(3, 6, dtype=bf))                   # head dim not a power of two
    assert not norm_rope.rope_fits(q, c.float(), c)
    assert not norm_rope.rope_fits(q[..., ::2], c[:, :4], c[:, :4])                # last dim strided


def test_a_missing_triton_leaves_the_stock_chains_with_its_reason(monkeypatch):
    """No Triton (or one that cannot define the kernels): the verdict says so and nothing is tried."""
    monkeypatch.setattr(norm_rope, "available", lambda: "Triton unavailable: ImportError: no module named triton")
    fastpath.clear_cache()
    exact.forget()
    tried = []
    monkeypatch.setattr(exact, "_inputs", lambda *a: tried.append(a))
    v = exact.prepare(torch.device("cuda", 0), "tiny", [((1, 1, 8), 1e-6)], [(2, 1, 8)], rms_norm_stock,
                      apply_rope_stock)
    assert not v.chosen and "not applicable: Triton unavailable" in v.line() and not tried and not exact._chosen
    fastpath.clear_cache()
