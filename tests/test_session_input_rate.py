"""The session's input-rate contract and its Force Listen request.

``SessionConfig.input_rate``: 24 kHz for every backbone (the default, the app's), or the backbone's native rate
(MiniCPM-o 4.5: 16 kHz, the stock's own input), handed to the backbone as is; any other rate, and a frame of
another length than one second at that rate, is refused in one line. ``process(..., force_listen=True)``
reaches a backbone that takes it (minicpm-o-4.5) and is refused for one that does not."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.session import DuplexSession, SessionConfig


def _mc(**kw) -> SessionConfig:
    return SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=3, cpu_threads=1, **kw)


def test_input_rate_is_24k_or_the_backbones_native_rate():
    assert SessionConfig(backbone="synthetic", device="cpu").resolved().input_rate == 24000
    assert _mc(input_rate=16000).resolved().input_rate == 16000
    with pytest.raises(ValueError, match=r"input_rate 16000 is not one the synthetic backbone takes; choose 24000 Hz"):
        SessionConfig(backbone="synthetic", device="cpu", input_rate=16000).resolved()
    for bad in (22050, 16000.0, True, "16000"):
        with pytest.raises(ValueError, match=r"choose 16000 Hz or 24000 Hz"):
            _mc(input_rate=bad).resolved()


def test_a_16k_session_hands_its_frames_as_they_are_and_refuses_other_lengths(one_torch_thread):
    s = DuplexSession(_mc(input_rate=16000))
    s.start()
    try:
        seen = []
        front = s.backbone.front

        class Spy:
            def __call__(self, x):
                seen.append(x.clone())
                return front(x)

            def __getattr__(self, name):
                return getattr(front, name)
        s.backbone.front = Spy()
        x = (np.random.RandomState(0).randn(16000) * 0.1).astype(np.float32)
        s.process(x)
        assert len(seen) == 1 and torch.equal(seen[0], torch.from_numpy(x))
        with pytest.raises(ValueError, match=r"one second of mono 16 kHz audio \(the session's input_rate\), "
                                             r"shape \(16000,\); got \(24000,\)"):
            s.process(np.zeros(24000, np.float32))
        s.process(x, force_listen=True)
        assert s.records[-1].decision == "listen" and len(s.records) == 2
    finally:
        s.close()


def test_force_listen_is_refused_by_a_backbone_that_takes_none():
    s = DuplexSession(SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu", seed=7))
    s.start()
    try:
        with pytest.raises(ValueError, match="the synthetic backbone takes no forced listen"):
            s.process(np.zeros(24000, np.float32), force_listen=True)
        assert s.records == []
    finally:
        s.close()
