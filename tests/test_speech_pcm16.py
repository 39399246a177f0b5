"""MiniCPM-o 4.5's speech goes through 16-bit PCM as its own duplex loop hands it on: Step-Audio2's
``Token2wav.stream`` returns PCM bytes (the float clipped to [-1, 1], x 32767, truncated toward zero to int16)
and the loop reads them back / 32768. The backbone declares it (``speech_pcm16``), the session sets it on the
tail (its own or one built on shared weights), and only the tail's audio is touched. CPU, tiny sizes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import registry
from engine.session import DuplexSession, SessionConfig
from engine.tail import pcm16


def test_the_pcm_step_is_the_stocks_arithmetic():
    x = np.array([0.5, -0.5, 1.069, -1.5, 0.99, 3.0e-5, -3.0e-5, 1.0e-5, 0.0, 1.0, -1.0], np.float32)
    want = np.array([16383, -16383, 32767, -32767, 32439, 0, 0, 0, 0, 32767, -32767], np.float32) / 32768.0
    got = pcm16(x)
    assert got.dtype == np.float32 and np.array_equal(got, want.astype(np.float32))
    # the stock's own lines: np.clip(wav, -1.0, 1.0) * 32767.0 -> astype('<i2'), then astype(float32) / 32768.0
    rng = np.random.default_rng(3)
    y = (rng.standard_normal(48000) * 0.6).astype(np.float32)
    stock = (np.clip(y, -1.0, 1.0) * 32767.0).astype("<i2").astype(np.float32) / 32768.0
    assert np.array_equal(pcm16(y), stock)
    assert np.abs(pcm16(y) - np.clip(y, -1, 1)).max() < 6.2e-5      # truncation and the 32767 / 32768 scale


def test_only_minicpmo_declares_pcm_speech():
    assert registry.get_backbone("minicpm-o-4.5").speech_pcm16 is True
    others = [b.name for b in registry.backbones() if b.name != "minicpm-o-4.5"]
    assert others and not any(registry.get_backbone(n).speech_pcm16 for n in others)


def _session(backbone: str, tail: str, **kw) -> DuplexSession:
    s = DuplexSession(SessionConfig(backbone=backbone, tail=tail, size="tiny", device="cpu", seed=2, cpu_threads=1,
                                    **kw))
    s.start()
    return s


@pytest.mark.parametrize("backbone,tail,pcm", [("minicpm-o-4.5", "step-audio2", True),
                                               ("synthetic", "step-audio2", False)])
def test_the_session_sets_the_tail_s_pcm_step_from_its_backbone(backbone, tail, pcm, one_torch_thread):
    s = _session(backbone, tail)
    try:
        assert s.tail.pcm16 is pcm
        step = {"audio": torch.linspace(-1.2, 1.2, 9)}
        out = s.tail._audio(step)
        assert np.array_equal(out, pcm16(step["audio"].numpy()) if pcm else step["audio"].numpy())
        shared = registry.get_tail(tail).make_tail(size="tiny", device="cpu", seed=2, shared=s.tail.shared_weights())
        assert shared.pcm16 is False                  # a tail built on shared weights learns it from its session
        again = DuplexSession(SessionConfig(backbone=backbone, tail=tail, size="tiny", device="cpu", seed=2,
                                            cpu_threads=1), tail=shared)
        again.start()
        try:
            assert again.tail is shared and shared.pcm16 is pcm
        finally:
            again.close()
    finally:
        s.close()
