"""The echo canceller (engine/echo/canceller.py) and the barge-in detector (engine/echo/bargein.py)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.bench.echo_sim import EchoPath, level_db, user_voice
from engine.bench.session import speech_like
from engine.echo import BargeInDetector, EchoCanceller

RATE = 24000
BLOCK = 480


def far_near(seconds: float = 4.0, delay_ms: float = 90.0, gain_db: float = -8.0, seed: int = 3, user=None,
             far_level: float = 1.0):
    """A speech-like far end (voiced bursts, broadband) and its echo at the microphone (plus noise, plus ``user``)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    far = (speech_like(int(seconds) + 1, seed)[:n] + rng.standard_normal(n).astype(np.float32) * 0.02) * far_level
    path = EchoPath(delay_ms, gain_db, seed)
    echo = np.concatenate([path(far[i:i + BLOCK]) for i in range(0, n, BLOCK)])
    near = echo + rng.standard_normal(n).astype(np.float32) * 5e-4
    if user is not None:
        near = near + user[:n]
    return far.astype(np.float32), near.astype(np.float32)


def run(aec: EchoCanceller, far: np.ndarray, near: np.ndarray, sizes=(BLOCK,)) -> np.ndarray:
    """Far then near, chunk by chunk (chunk sizes cycle through ``sizes``)."""
    out, i, k = [], 0, 0
    while i < near.size:
        n = sizes[k % len(sizes)]
        aec.far(far[i:i + n])
        out.append(aec.near(near[i:i + n]))
        i, k = i + n, k + 1
    return np.concatenate(out)


def test_erle_on_a_synthetic_far_near_pair():
    far, near = far_near()
    aec = EchoCanceller(RATE)
    out = run(aec, far, near)
    late = slice(RATE, None)                     # after the first second (AEC3 converges)
    erle = 10 * np.log10(np.sum(near[late].astype(np.float64) ** 2) / np.sum(out[late].astype(np.float64) ** 2))
    assert erle >= 20.0, erle
    assert out.size == near.size and out.dtype == np.float32
    assert aec.suppression_db() is not None and aec.suppression_db() >= 20.0
    assert 0.0 < aec.cost() < 0.5                # a small fraction of real time, even on a loaded machine


def test_disabled_is_passthrough():
    far, near = far_near(seconds=1.0)
    aec = EchoCanceller(RATE, enabled=False)
    out = run(aec, far, near, sizes=(7, 480, 1001))
    assert np.array_equal(out, near)
    assert aec.suppression_db() is None


def test_framing_carry_over_is_bit_exact_for_odd_chunk_sizes():
    far, near = far_near(seconds=2.0)
    whole = EchoCanceller(RATE)
    whole.far(far)
    ref = whole.near(near)
    for sizes in ((7, 241, 13, 999), (1, 2, 3, 5, 8, 4801), (239,)):
        aec = EchoCanceller(RATE)
        aec.far(far)
        parts, i, k = [], 0, 0
        while i < near.size:
            n = sizes[k % len(sizes)]
            parts.append(aec.near(near[i:i + n]))
            i, k = i + n, k + 1
        out = np.concatenate(parts)
        assert out.size == near.size
        assert np.array_equal(out, ref), sizes
    assert np.abs(ref).max() > 0                 # not all zeros


def test_fallback_rate_is_resampled_and_keeps_lengths():
    rng = np.random.default_rng(1)
    aec = EchoCanceller(22050)
    assert aec.proc_rate == 16000
    x = (rng.standard_normal(22050) * 0.05).astype(np.float32)
    outs = [aec.near(x[i:i + 441]) for i in range(0, x.size, 441)]
    assert sum(o.size for o in outs) == x.size


def test_user_passes_while_aec3_converges():
    """AEC3 holds the near end back for its first half second of far end; the user talking over the speaker
    then must still come through (the initial-phase bypass)."""
    user = np.zeros(3 * RATE, np.float32)
    burst = speech_like(2, 9)[:RATE]
    user[int(0.3 * RATE):int(0.3 * RATE) + RATE] = burst
    far, near = far_near(seconds=3.0, user=user, far_level=0.5, gain_db=-4.0)   # a loud echo, the user above it
    out = run(EchoCanceller(RATE), far, near)
    for a in range(int(0.4 * RATE), int(1.2 * RATE), RATE // 10):             # every 100 ms of the user's turn
        assert level_db(out[a:a + RATE // 10]) > level_db(user[a:a + RATE // 10]) - 10.0, a / RATE


def test_bad_delay_is_one_clear_error():
    aec = EchoCanceller(RATE)
    with pytest.raises(ValueError, match="latency in ms"):
        aec.set_delay_ms(-5)
    aec.set_delay_ms(80)
    assert aec.delay_ms == 80


def test_detector_fires_fast_on_onset_while_playing_and_ducks_until_the_engine_follows():
    voice, turns = user_voice(6, seed=2)
    noise = np.random.default_rng(0).standard_normal(voice.size).astype(np.float32) * 5e-4
    det = BargeInDetector(RATE)
    a, b = turns[0]
    fired = []
    for i in range(0, voice.size, BLOCK):
        fired += det.push(voice[i:i + BLOCK] + noise[i:i + BLOCK], playing=True)
    assert len(fired) == len(turns)
    first = fired[0]
    assert a <= first.fired_at <= a + int(0.12 * RATE)          # within 120 ms of the onset
    assert abs(first.onset_at - a) <= int(0.06 * RATE)
    assert first.latency_ms(RATE) < 120
    assert det.ducked
    assert not det.allows(turns[-1][0] // RATE)                  # speech made before the user spoke: dropped
    assert det.allows(turns[-1][0] // RATE + 1) and not det.ducked


def test_detector_quiet_cases():
    det = BargeInDetector(RATE)
    voice, turns = user_voice(6, seed=4)
    for i in range(0, voice.size, BLOCK):                       # the model silent: nothing to barge into
        assert det.push(voice[i:i + BLOCK], playing=False) == []
    hum = (np.sin(np.arange(4 * RATE) * 2 * np.pi * 100 / RATE) * 0.03).astype(np.float32)   # -33 dBFS, steady
    det2 = BargeInDetector(RATE)
    hits = [h for i in range(0, hum.size, BLOCK) for h in det2.push(hum[i:i + BLOCK], playing=True)]
    assert len(hits) <= 1 and all(h.fired_at < 0.2 * RATE for h in hits)   # steady noise is the floor, not speech
    with pytest.raises(ValueError, match="sensitivity"):
        BargeInDetector(RATE, sensitivity="loud")


def test_detector_fires_when_the_model_starts_over_a_talking_user():
    voice, turns = user_voice(6, seed=2)
    a, b = turns[0]
    det = BargeInDetector(RATE)
    start = a + int(0.5 * RATE)                                 # the model starts 0.5 s into the user's turn
    fired = []
    for i in range(0, b, BLOCK):
        fired += det.push(voice[i:i + BLOCK], playing=i >= start)
    assert len(fired) == 1 and start <= fired[0].fired_at <= start + 2 * BLOCK


def test_echo_level_predictor_finds_the_lag_and_loss_from_levels_alone():
    """A microphone that follows the far end 170 ms later and 9 dB lower (levels only, with a user talking in
    the far end's silences and once over it): the predictor reads the lag and the loss, and predicts the echo
    of a far-end frame one lag later; a user frame 15 dB above that prediction stands out."""
    from engine.echo.doubletalk import EchoLevelPredictor
    rng = np.random.default_rng(5)
    n, lag = 900, 17
    far = np.where((np.arange(n) // 60) % 3 == 2, -200.0, rng.uniform(-30.0, -15.0, n))
    near = np.full(n, -66.0)
    near[lag:] = np.maximum(far[:-lag] - 9.0 + rng.normal(0, 0.5, n - lag), -66.0)
    user = (np.arange(n) % 180 >= 130) & (np.arange(n) % 180 < 170)        # in silences and over the far end
    near[user] = rng.uniform(-20.0, -12.0, int(user.sum()))
    p = EchoLevelPredictor()
    for f, m, u in zip(far, near, user):
        p.push(float(f), float(m), usable=not u)
    assert abs(p.lag - lag) <= 1 and -10.5 <= p.loss_db <= -7.0, (p.lag, p.loss_db)
    for _ in range(lag):
        p.push(-20.0, -66.0, True)
    assert p.predicted_db() == pytest.approx(-20.0 + p.loss_db, abs=0.01)
    assert -14.0 > p.predicted_db() + 6.0 - 3.0                           # a frame at -14 dBFS is the user


def test_double_talk_check_passes_the_user_over_a_loud_echo():
    """Once converged, the user starting over a loud echo (the echo 6 dB under the far end, the user ~5 dB over
    the echo) comes through within 100 ms, and no echo-only frame is passed as the user."""
    far, near = far_near(seconds=8.0, gain_db=-6.0, delay_ms=210.0, seed=11)
    user = np.zeros(far.size, np.float32)
    a, voice = int(6.0 * RATE), speech_like(2, 4)[:RATE]
    user[a:a + RATE] = voice * np.float32(10 ** ((level_db(near[a:a + RATE]) + 5.0 - level_db(voice)) / 20))
    aec = EchoCanceller(RATE)
    out = run(aec, far, near + user)
    w = RATE // 50
    loud = [i for i in range(a, a + RATE // 2, w) if level_db(out[i:i + w]) > level_db(user[i:i + w]) - 6.0]
    assert loud and loud[0] - a <= RATE // 10, loud[:3]
    assert aec._predictor.lag is not None and abs(aec._predictor.lag - 21) <= 2, aec._predictor.lag
    echo_only = out[int(4.5 * RATE):a]                                      # converged, no user: all removed
    assert level_db(echo_only) < level_db(near[int(4.5 * RATE):a]) - 20.0


def test_a_native_library_that_fails_to_load_is_one_clear_echo_unavailable(monkeypatch):
    """A bundle or install whose livekit cannot load its native library (not an ImportError: livekit raises its
    own) makes echo cancellation unavailable with one line, which the app turns into 'echo off', never a crash."""
    import sys
    import types
    from engine.echo import EchoUnavailable
    from engine.echo.canceller import LivekitProcessor

    def broken(name):
        raise RuntimeError("failed to load liblivekit_ffi.so: No module named 'livekit.rtc.resources'")
    fake = types.ModuleType("livekit")
    fake.__getattr__ = broken
    monkeypatch.setitem(sys.modules, "livekit", fake)
    monkeypatch.delitem(sys.modules, "livekit.rtc", raising=False)
    with pytest.raises(EchoUnavailable, match="liblivekit_ffi"):
        LivekitProcessor(24000)
