"""The rehearsed second (rehearse.py): a listening and a speaking second's eager paths run on scratch, and the
session afterwards is the session without it — same decisions, texts, codes and LLM ids every second, same
stores — whether it runs before the first second or in the middle of a reply; stock stores are never rehearsed."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backbones.base import TokenFormat
from engine.backbones.minicpmo45 import MiniCPMO45Backbone
from engine.backbones.minicpmo45.rehearse import can_rehearse, rehearse
from engine.vad import VadResult

pytestmark = pytest.mark.bits             # also run with the AVX2 kernels in CI (.ci/run)

PATTERN = [1, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0]


def _run(rehearse_at=(), demand=True):
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", seed=3, demand_sized=demand,
                           reply_seconds=3)
    torch.manual_seed(3)
    b.start()
    rng = np.random.default_rng(0)
    seen, ran = [], []
    for k, sp in enumerate(PATTERN):
        if k in rehearse_at:
            ran.append(rehearse(b.protocol, b.audio_tokens(), b.device))
        f = (rng.standard_normal(24000) * (0.2 if sp else 0.001)).astype(np.float32)
        b.listen(torch.from_numpy(f), VadResult(bool(sp), 1.0 if sp else 0.0, 0.0, -70.0))
        t = b.think(25)
        seen.append((t.decision, t.text, t.codes, t.llm_ids, b.kv_tts.length, b.kv_llm.length))
    stores = (b.kv_llm.export(), b.kv_tts.export())
    return seen, stores, ran, b


def test_a_rehearsed_second_changes_nothing_after_it(one_torch_thread):
    plain, stores, _, b = _run()
    assert any(s[0] == "speak" for s in plain) and b.rehearsed is None      # on the CPU start does not rehearse
    # before the first second, before a reply (TTS history empty) and in a reply (second 10: 44 TTS positions)
    got, got_stores, ran, _ = _run(rehearse_at=(0, 5, 10))
    assert ran == ["listen+speak"] * 3 and plain[9][4] > 0        # the TTS history second 10 starts from
    assert got == plain
    for a, c in zip(stores, got_stores):
        assert all(torch.equal(x, y) for x, y in zip(a, c))


def test_the_comparison_fails_when_the_rehearsal_leaves_a_draw_behind(one_torch_thread, monkeypatch):
    """The planted error: the random states are not put back (a rehearsal's draws move the sampler on)."""
    import engine.backbones.minicpmo45.rehearse as R
    plain, _, _, _ = _run()
    monkeypatch.setattr(R._RandomStates, "restore", lambda self: None)
    got, _, _, _ = _run(rehearse_at=(0,))
    assert got != plain


def test_stock_stores_are_never_rehearsed(one_torch_thread):
    _, _, ran, b = _run(rehearse_at=(2,), demand=False)
    assert ran == [None] and not can_rehearse(b.protocol, 33, 45)


def test_the_front_end_warm_up_moves_no_generator_and_no_session_state():
    """warm_front_end runs throwaway front ends (the CPU mel's first calls): the default generator is where it
    was, and a front end made before it gives the features it gives without it."""
    from engine.backbones.minicpmo45.audio import FrontEnd, slaney_mel, warm_front_end, N_FFT
    fb, win = slaney_mel(), torch.hann_window(N_FFT)
    x = torch.randn(24000, generator=torch.Generator().manual_seed(1)) * 0.1
    plain = FrontEnd(fb, win, "cpu", True)(x)
    front = FrontEnd(fb, win, "cpu", True)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    warm_front_end(fb, win, "cpu")
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(front(x), plain)
