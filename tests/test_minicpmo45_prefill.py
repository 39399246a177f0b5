"""The TTS condition prefill through layer graphs of its width (tts.PrefillGraphs): the eager forward's bits at
every width a second can make and at any history length; nothing (None: the eager forward runs) for a width
without graphs or over a store that moved, until captured again. On the CPU the graphs' segments run eagerly
(the capture itself is CUDA's: tests/test_minicpmo45_gpu.py replays them)."""
from __future__ import annotations

import pytest

import torch

from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.tts import TTS, PrefillGraphs

pytestmark = pytest.mark.bits             # also run with the AVX2 kernels in CI (.ci/run)

D = preset("tiny")
WIDEST = D.sampling.max_tokens_per_unit - 1


def _tts() -> TTS:
    tts = TTS(D.tts, D.llm).eval()
    seeded_init(tts, 2)
    return tts


def _store(capacity: int = 96):
    region = kv_regions("tts", D.tts.layers, D.tts.kv_heads, D.tts.head_dim, 45, D.tts.max_positions,
                        torch.float32, "")[0]
    return make_store(True, region, D.tts.layers, capacity, "cpu", growable=True)


def test_every_width_gives_the_eager_bits_at_any_length(one_torch_thread):
    tts = _tts()
    kv, ref = _store(), _store()
    pf = PrefillGraphs(tts, torch.device("cpu"), WIDEST)
    pf.capture(kv)
    assert sorted(pf.by_width) == list(range(1, WIDEST + 1)) and kv.length == 0
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for t in (3, 1, WIDEST, 2, 5):                                 # histories of 0, 3, 4, 4 + WIDEST, ...
            cond = torch.randn(t, D.tts.hidden, generator=g)
            got, want = pf.run(cond, kv), tts(cond, ref)
            assert got is not None and got.dtype == torch.float32 and got.shape == (1, D.tts.codes)
            assert torch.equal(got, want), f"prefill logits differ at width {t}, length {ref.length - t}"
            code = torch.randint(0, D.tts.codes, (1,), generator=g)   # a decode step between prefills
            assert torch.equal(tts.step_code(code, kv), tts.step_code(code, ref))
    n = ref.length
    assert kv.length == n and pf.replays == 5
    assert torch.equal(kv.k_buf[:, :, :n], ref.k_buf[:, :, :n]) and torch.equal(kv.v_buf[:, :, :n], ref.v_buf[:, :, :n])


def test_no_graphs_no_run_and_a_moved_store_needs_a_new_capture(one_torch_thread):
    tts = _tts()
    kv = _store(capacity=24)
    pf = PrefillGraphs(tts, torch.device("cpu"), 4)
    cond = torch.randn(3, D.tts.hidden)
    with torch.no_grad():
        assert pf.run(cond, kv) is None and kv.length == 0               # nothing captured yet
        pf.capture(kv)
        assert pf.run(torch.randn(5, D.tts.hidden), kv) is None          # wider than any graph
        assert pf.run(cond, kv) is not None and kv.length == 3
        kv.begin_step(40)                                                # the store moves to more room
        kv.end_step()
        assert kv.grown == 1 and not pf.valid_for(kv) and pf.run(cond, kv) is None and kv.length == 3
        assert pf.capture(kv, widths=2) == 2 and sorted(pf.by_width) == [1, 2]     # a few widths a second
        assert not pf.valid_for(kv) and pf.run(cond, kv) is None and pf.run(cond[:2], kv) is not None
        assert pf.capture(kv, widths=2) == 2 and pf.valid_for(kv) and pf.capture(kv) == 0
        assert pf.run(cond, kv) is not None and kv.length == 8


def test_a_capture_refuses_a_store_without_room_for_its_warm_ups(one_torch_thread):
    kv = _store(capacity=8)
    kv.length = 6
    try:
        PrefillGraphs(_tts(), torch.device("cpu"), 4).capture(kv)
    except RuntimeError as e:
        assert "no room" in str(e)
    else:
        raise AssertionError("a capture past the store's room went ahead")
