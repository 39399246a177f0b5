"""MiniCPM-o 4.5's speech as its own duplex loop hands it on: through 16-bit PCM (Step-Audio2's
``Token2wav.stream`` returns PCM bytes: the float clipped to [-1, 1], x 32767, truncated toward zero to int16; the
loop reads them back / 32768), and each speaking unit at least a second long (shorter speech that does not end its
turn after silence; a unit that decoded nothing: a second of silence). The backbone declares both
(``speech_pcm16``, ``pads_short_speech``), the session applies them (on its own tail or one built on shared
weights), and only the speech is touched. CPU, tiny sizes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import registry
from engine.session import DuplexSession, SessionConfig
from engine.backbones.base import Thought
from engine.tail import pcm16, whole_second


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


def test_only_minicpmo_declares_pcm_speech_in_whole_seconds():
    mc = registry.get_backbone("minicpm-o-4.5")
    assert mc.speech_pcm16 is True and mc.pads_short_speech is True
    others = [registry.get_backbone(b.name) for b in registry.backbones() if b.name != "minicpm-o-4.5"]
    assert others and not any(b.speech_pcm16 or b.pads_short_speech for b in others)


def test_a_short_unit_comes_after_silence_up_to_a_second():
    x = np.arange(1, 9601, dtype=np.float32)
    got = whole_second(x, 24000)
    assert got.shape == (24000,) and not got[:14400].any() and np.array_equal(got[14400:], x)
    full = np.ones(24000, np.float32)
    assert whole_second(full, 24000) is full and whole_second(np.ones(30720, np.float32), 24000).shape == (30720,)
    assert np.array_equal(whole_second(np.zeros(0, np.float32), 24000), np.zeros(24000, np.float32))


def test_the_session_pads_a_short_speaking_unit_unless_it_ends_its_turn(one_torch_thread):
    s = _session("minicpm-o-4.5", "step-audio2", demand_sized=False, graph_replay=False)
    try:
        codes = torch.full((1, 13), 4218, dtype=torch.long)                 # 3 silences + 10 codes: one short chunk
        codes[0, 3:] = torch.arange(100, 110)
        audio, skipped = s._speak(Thought("speak", codes, 10), 25)
        assert not skipped and audio.shape == (24000,) and not audio[:24000 - 9600].any() and audio[-9600:].any()
        audio, _ = s._speak(Thought("speak", codes[:, 3:], 10, turn_end="end"), 25)   # the turn's end: as decoded
        assert 0 < audio.shape[0] < 24000
        audio, _ = s._speak(Thought("speak", codes[:, :5], 2), 25)          # under 8 tokens: nothing decoded yet
        assert np.array_equal(audio, np.zeros(24000, np.float32))
        audio, skipped = s._speak(Thought("listen", None, 0), 25)           # a listening unit plays no speech
        assert skipped and audio.shape == (0,)
    finally:
        s.close()


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
