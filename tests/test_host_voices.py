"""The voice is chosen once and is part of the shared-weights key: two hosted sessions of the same tail
weights but different voices each speak with their own (CPU, tiny sizes, seeded random weights).

Before, ``WeightsKey.tail`` had no voice while the shared tail modules hold the voice prompt: the second
session was built around the first one's prompt and spoke with the first one's voice. The last test
brings that key back and shows exactly that.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.audio import frames_of
from engine.bench.session import speech_like
from engine.host import EngineHost
from engine.host import session as hosted_session
from engine.host.weights import WeightsKey
from engine.session import DuplexSession, LiveError, SessionConfig

SECONDS = 5


def _voice(path, seed: int) -> str:
    """A fresh random voice prompt (.npz): 3 s of tokens, their mel (2 frames a token), an x-vector."""
    rng = np.random.default_rng(seed)
    np.savez(path, prompt_tokens=rng.integers(0, 6561, 75), prompt_mel=rng.standard_normal((150, 80)),
             speaker_embedding=rng.standard_normal(192))
    return str(path)


@pytest.fixture
def voices(tmp_path):
    return _voice(tmp_path / "a.npz", 11), _voice(tmp_path / "b.npz", 12)


def _cfg(voice: str) -> SessionConfig:
    return SessionConfig(tail="step-audio2", size="tiny", device="cpu", seed=3, cpu_threads=1, voice=voice)


def _solo(cfg: SessionConfig, frames) -> np.ndarray:
    s = DuplexSession(cfg)
    s.start()
    out = [s.process(f)[0] for f in frames]
    s.close()
    return np.concatenate(out)


def _hosted(cfgs, frames):
    """Both sessions in one host (the second built around the first one's cached weights), same input."""
    host = EngineHost(device="cpu")
    runners = [host.open(c, force=True) for c in cfgs]
    for r in runners:
        r.start()
        assert r.ready.wait(120)
    for f in frames:
        for r in runners:
            r.submit(f)
    outs = []
    for r in runners:
        got = []
        for _ in frames:
            res = r.results.get(timeout=120)
            assert not isinstance(res, LiveError), res.message
            got.append(res.audio)
        outs.append(np.concatenate(got))
        r.stop(drain=True)
    reused = [bool(r.hosted.memory.weights_reused) for r in runners]
    host.close()
    return outs, reused


def test_the_voice_is_resolved_once_and_keys_the_shared_weights(voices):
    a, b = (_cfg(v).resolved() for v in voices)
    assert (a.voice, a.voice_origin) == (voices[0], "--voice")
    assert a.resolved() == a                               # resolving again chooses nothing new
    assert WeightsKey.tail(a) != WeightsKey.tail(b)        # two voices, two keys
    old = [dataclasses.replace(WeightsKey.tail(c), conditioning=None) for c in (a, b)]
    assert old[0] == old[1]                                # the key without the voice: one key for both
    assert WeightsKey.backbone(a) == WeightsKey.backbone(b)   # the backbone's weights are still shared


def test_two_hosted_sessions_each_speak_with_their_own_voice(voices, one_torch_thread):
    frames = frames_of(speech_like(SECONDS, seed=102))[:SECONDS]
    cfgs = [_cfg(v) for v in voices]
    solo = [_solo(c, frames) for c in cfgs]
    assert any(np.abs(s).max() > 0 for s in solo)          # somebody spoke
    assert not np.array_equal(solo[0], solo[1])            # same input and weights: only the voice differs
    outs, reused = _hosted(cfgs, frames)
    for i in range(2):
        assert np.array_equal(outs[i], solo[i]), f"hosted session {i} does not speak with its own voice"
    assert reused == [False, True]                         # the backbone's weights were shared all the same


def test_without_the_voice_in_the_key_the_second_session_took_the_first_voice(voices, one_torch_thread,
                                                                              monkeypatch):
    old_key = WeightsKey.tail.__func__

    def tail_key_without_voice(cls, cfg):
        return dataclasses.replace(old_key(cls, cfg), conditioning=None)

    monkeypatch.setattr(hosted_session.WeightsKey, "tail", classmethod(tail_key_without_voice))
    frames = frames_of(speech_like(SECONDS, seed=102))[:SECONDS]
    cfgs = [_cfg(v) for v in voices]
    outs, _ = _hosted(cfgs, frames)
    assert np.array_equal(outs[1], _solo(cfgs[0], frames))     # session b spoke with a's voice
    assert not np.array_equal(outs[1], _solo(cfgs[1], frames))
