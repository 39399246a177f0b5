"""One-query attention over the grouped heads as they are (gqa.py): the replayed forward's segments with it give
the eager forward's bits (on the CPU, where SDPA's grouped call equals the widened one), the grouped call over
the histories the check proved and the widening copies past them; the self-check decides band by band of
history length, chooses the call up to the last band of an unbroken run of passes, and refuses a candidate one
rounding off; the CPU never takes it."""
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
    monkeypatch.setattr(gqa, "up_to", lambda device: 14)              # proved over histories of up to 14
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
    # one query only, over histories the check proved: the two-position feed keeps the widened path under its
    # mask, and the one-query steps over 16 and 17 positions widen too (past the 14 proved)
    assert calls == [n for n in (12, 13) for _ in range(d.layers)]
    assert torch.equal(ours.k_buf[:, :, :17], ref.k_buf[:, :, :17])


def test_the_check_chooses_equal_bits_by_band_and_refuses_a_rounding_off(monkeypatch):
    fastpath.clear_cache()
    monkeypatch.setenv(fastpath.ENV_CACHE, "")
    v = gqa.prepare("cpu", 8, 2, 16, torch.float32, on_cpu=True)
    assert v.chosen and v.scope == "" and "from 1 to 16,384 positions" in v.reason and not gqa.chosen("cpu")
    real = gqa.grouped
    # as on the H200: equal over short histories, one rounding off past 1,600 positions
    monkeypatch.setattr(gqa, "grouped", lambda q, k, v: real(q, k, v) * (1 + 2 ** -20 * (k.shape[2] > 1600)))
    fastpath.clear_cache()
    longest, verdicts = gqa.check_bands(torch.device("cpu"), 8, 2, 16, torch.float32)
    assert longest == 1536 and [x.chosen for x in verdicts] == [True, True, True, False]
    v = gqa.summary(longest, verdicts)
    assert v.chosen and v.scope == "up to 1,536 positions" and "1,537-2,048 positions: max abs diff" in v.reason
    monkeypatch.setattr(gqa, "grouped", lambda q, k, v: real(q, k, v) * (1 + 2 ** -20))
    fastpath.clear_cache()
    v = gqa.prepare("cpu", 8, 2, 16, torch.float32, on_cpu=True)
    assert not v.chosen and "max abs diff" in v.reason


def test_every_band_checks_each_key_block_count_and_its_edges():
    assert gqa.BANDS[0][0] == 1 and gqa.BANDS[-1][1] == 16384
    assert all(a[1] + 1 == b[0] for a, b in zip(gqa.BANDS, gqa.BANDS[1:]))            # no gap, no overlap
    for first, last in gqa.BANDS:
        lengths = gqa.band_lengths(first, last)
        assert lengths[0] == first and lengths[-1] == last
        assert all(m + d in lengths for m in range(64 * -(-first // 64), last, 64) for d in (-1, 0, 1)
                   if first <= m + d <= last)


def test_not_applicable_on_the_cpu_or_without_groups():
    assert "not applicable" in gqa.prepare("cpu", 8, 2, 16, torch.float32).reason
    assert "no grouped heads" in gqa.prepare("cuda", 12, 12, 64, torch.bfloat16).reason
