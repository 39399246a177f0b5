"""One-query attention over the grouped heads as they are (gqa.py): the replayed forward's segments with it give
the eager forward's bits (on the CPU, where SDPA's grouped call equals the widened one); the self-check chooses it
only when every length's output is equal, and refuses a candidate one rounding off; the CPU never takes it."""
from __future__ import annotations

import pytest

import torch

from engine import fastpath
from engine.backbones.minicpmo45 import gqa
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs

pytestmark = pytest.mark.bits             # also run with the AVX2 kernels in CI (.ci/run)


def test_segments_with_the_grouped_call_give_the_eager_bits(one_torch_thread, monkeypatch):
    d = preset("tiny").llm
    assert d.heads > d.kv_heads                                       # grouped heads, as the released 32/8
    monkeypatch.setattr(gqa, "chosen", lambda device: True)
    calls = []
    real = gqa.grouped
    monkeypatch.setattr(gqa, "grouped", lambda q, k, v: calls.append(k.shape[2]) or real(q, k, v))
    llm = Qwen3(d).eval()
    seeded_init(llm, 6)
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 33, d.max_positions, torch.float32, "")
    ref, ours = (make_store(True, regions[0], d.layers, 64, "cpu") for _ in range(2))
    one, feed = (LayerGraphs(llm, ours, torch.device("cpu"), capture=False, tokens=t) for t in (1, 2))
    assert one.attend.grouped
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for t in (11, 1, 1, 2, 1, 1):
            x = torch.randn(t, d.hidden, generator=g)
            h = llm(x, ref)
            h2, logits = (one if t == 1 else feed).forward(x) if t <= 2 else (llm(x, ours), None)
            assert torch.equal(h2, h)
            if t == 1:
                assert torch.equal(logits, llm.logits(h[-1]))
    # one query only: the two-position feed keeps the widened path under its mask
    assert calls == [n for n in (12, 13, 16, 17) for _ in range(d.layers)]
    assert torch.equal(ours.k_buf[:, :, :17], ref.k_buf[:, :, :17])


def test_the_check_chooses_equal_bits_and_refuses_a_rounding_off(monkeypatch):
    fastpath.clear_cache()
    monkeypatch.setenv(fastpath.ENV_CACHE, "")
    v = gqa.prepare("cpu", 8, 2, 16, torch.float32, on_cpu=True)
    assert v.chosen and "bit-identical" in v.reason and not gqa.chosen("cpu")
    real = gqa.grouped
    monkeypatch.setattr(gqa, "grouped", lambda q, k, v: real(q, k, v) * (1 + 2 ** -20))
    fastpath.clear_cache()
    v = gqa.prepare("cpu", 8, 2, 16, torch.float32, on_cpu=True)
    assert not v.chosen and "max abs diff" in v.reason


def test_not_applicable_on_the_cpu_or_without_groups():
    assert "not applicable" in gqa.prepare("cpu", 8, 2, 16, torch.float32).reason
    assert "no grouped heads" in gqa.prepare("cuda", 12, 12, 64, torch.bfloat16).reason
