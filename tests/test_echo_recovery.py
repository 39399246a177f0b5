"""The canceller keeps itself working: the echo delay measured from the signals (GCC-PHAT), the health watch
(suppression over the model's speech, confirmed on the output), and the recovery when the echo path's delay
jumps (engine/echo: delay, health, canceller, path)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from engine.bench.echo_sim import room_response
from engine.echo import EchoCanceller
from engine.echo.delay import DelayTracker
from engine.echo.health import FAST, EchoHealth
from engine.echo.path import AudioPath
from engine.echo.playout import Playback
from engine.echo.queues import PlaybackQueue, RingBuffer

RATE = 24000


def _voice(seconds: float, seed: int) -> np.ndarray:
    """Speech-like noise: bursts of low-passed noise with pauses (no pitch shared with another voice)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    x = np.convolve(rng.standard_normal(n), np.ones(6) / 6, mode="same")
    env = (np.sin(2 * np.pi * 0.4 * np.arange(n) / RATE + rng.uniform(0, 6)) > -0.3).astype(float)
    return (0.1 * x * env).astype(np.float32)


def _echo(far: np.ndarray, delays_ms, gain_db: float = -10.0, seed: int = 3) -> np.ndarray:
    """``far`` through a room, its delay ``delays_ms[i]`` from second ``10 i`` on (steps)."""
    h = room_response(seed, RATE) * 10 ** (gain_db / 20)
    out = np.zeros(far.size)
    for i, d in enumerate(delays_ms):
        k = int(d * RATE / 1000)
        e = np.convolve(np.concatenate([np.zeros(k), far]), h)[:far.size]
        out[i * 10 * RATE:(i + 1) * 10 * RATE] = e[i * 10 * RATE:(i + 1) * 10 * RATE]
    return out.astype(np.float32)


def test_the_delay_tracker_finds_the_echo_delay_and_its_jump_through_double_talk():
    far = _voice(20, 1)
    mic = _echo(far, [180, 320]) + 0.5 * _voice(20, 9) + np.float32(5e-4)
    t = DelayTracker(RATE)
    seen = []
    for i in range(0, far.size, 480):
        t.push(far[i:i + 480], mic[i:i + 480])
        if t.changed:
            seen.append((i / RATE, 1000.0 * t.delay / RATE))
    assert seen[0][1] == pytest.approx(180, abs=4) and seen[0][0] < 5.0
    assert seen[-1][1] == pytest.approx(320, abs=4) and 10.0 < seen[-1][0] < 13.5
    assert len(seen) == 2                             # the user's voice over it moved nothing


def test_health_suspects_only_frames_the_echo_is_left_in():
    h = EchoHealth(confirm=lambda: False)            # the output holds no echo: the user talking
    for _ in range(100):
        h.frame(1.0, 1e-7, 1e-7, far_active=False, user=False)        # the quiet floor
    for _ in range(3 * FAST):
        h.frame(1e4, 1e4, 1e4, far_active=True, user=False)           # nothing taken out
    assert not h.suspect and not h.due()
    h = EchoHealth(confirm=lambda: True)
    for _ in range(100):
        h.frame(1.0, 1e-7, 1e-7, far_active=False, user=False)
    for _ in range(FAST + 60):
        h.frame(1e4, 1e4, 1e4, far_active=True, user=False)
    assert h.suspect and h.due()
    h.recovered()
    assert not h.suspect and not h.due() and h.recoveries == 1
    for _ in range(2 * FAST):                         # healthy again: 40 dB out, read back
        h.frame(1e4, 1.0, 1.0, far_active=True, user=False)
    assert h.suppression_db() == pytest.approx(40.0, abs=0.1) and not h.suspect


class _Sink:
    def __init__(self):
        self.rate = RATE
        self.queue = PlaybackQueue(RATE, 0.0)
        self.played = RingBuffer(RATE * 4)
        self.latency_s = 0.0


def _path_run(far: np.ndarray, mic: np.ndarray) -> tuple:
    """The audio path over 20 ms blocks, the speaker having played ``far`` exactly as the blocks come."""
    sink = _Sink()
    src = types.SimpleNamespace(rate=RATE, latency_s=0.0)
    path = AudioPath(src, RATE, Playback(sink))
    out = []
    for i in range(0, mic.size, 480):
        sink.played.write(far[i:i + 480])
        out.append(path.process(mic[i:i + 480], path.drain_far()))
    return np.concatenate(out), path


def test_a_delay_jump_is_recovered_with_one_event_line():
    """120 ms, then 300 ms from second 10 (a sound server re-syncing): before the recovery AEC3 needed many
    seconds at a few dB; with it the echo is down by 20 dB again within two seconds, one event line says so."""
    far = _voice(20, 5)
    echo = _echo(far, [120, 300])
    mic = echo + (np.random.default_rng(0).standard_normal(far.size) * 5e-4).astype(np.float32)
    out, path = _path_run(far, mic)
    lines = [text for kind, text in path.events if kind == "echo"]
    assert len(lines) == 1 and "re-aligned the reference" in lines[0] and "reset the canceller" in lines[0], lines
    for a in (12, 14, 16, 18):
        seg = slice(a * RATE, (a + 2) * RATE)
        act = np.abs(echo[seg]) > 1e-3
        erle = 10 * np.log10(np.sum(mic[seg][act] ** 2) / np.sum(out[seg][act] ** 2))
        assert erle > 20.0, (a, erle)


def test_a_recovery_resets_aec3_and_rearms_the_guard():
    c = EchoCanceller(RATE)
    far = _voice(4, 7)
    for i in range(0, far.size, 480):
        c.far(far[i:i + 480])
        c.near(0.3 * far[i:i + 480])
    assert c.far_active_s > 2.0
    old = c._processor.apm
    c.recover()
    assert c._processor.apm is not old and c.far_active_s == 0.0 and c.resets == 1 and c.health.recoveries == 1


def test_the_double_talk_check_follows_an_echo_that_got_louder():
    """A speaker turned up by 6 dB: the predicted echo follows within a second of its speech (the loss over the
    newest frames), so the louder echo is not taken for the user's voice."""
    from engine.echo.doubletalk import EchoLevelPredictor
    rng = np.random.default_rng(11)
    p, far = EchoLevelPredictor(), []
    for k in range(1200):
        f = float(rng.uniform(-40, -20)) if (k // 50) % 4 else -90.0      # speech in stretches, pauses
        far.append(f)
        lagged = max(far[-15 - 6:-15] or [-200.0])                        # the echo: 150 ms later, 12 dB down
        loss = -12.0 if k < 1000 else -6.0                                 # turned up at frame 1000
        p.push(f, max(-70.0, lagged + loss), usable=True)
    assert p.lag is not None and abs(p.lag - 15) <= 2
    assert p.loss_db == pytest.approx(-6.0, abs=1.5)
