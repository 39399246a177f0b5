"""The simulated room of ``duplexcadence-bench echo``: an echo path, a user's voice at seeded times, and the
loop that plays a session's speech through both and back into its input, second by second.

Nothing here is a model of a particular room: the echo path (engine/echo/room.py, shared with the app's
``--simulate-echo``) is a delay, a gain and a short seeded room impulse response; the user is the speech-like
voice of ``duplexcadence-bench session`` (engine/bench/session.speech_like) cut into turns at seeded times.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from engine.audio import SESSION_RATE
from engine.bench.session import speech_like
from engine.echo import BargeInDetector, EchoCanceller
from engine.echo.room import EchoPath, room_response  # noqa: F401  (the bench's room, shared with the app)
from engine.session import DuplexSession, SessionConfig

RATE = SESSION_RATE
BLOCK = RATE // 50                  # 20 ms: the audio callback's block
MIC_NOISE = 5e-4                    # the microphone's own noise (about -66 dBFS)
SPEECH_DB = -45.0                   # a played block louder than this is the model speaking


def level_db(x: np.ndarray) -> float:
    return 10.0 * np.log10(float(np.mean(np.square(x, dtype=np.float64))) + 1e-12) if x.size else -120.0


def user_voice(seconds: int, seed: int, rate: int = RATE) -> Tuple[np.ndarray, List[Tuple[int, int]]]:
    """The user's turns at seeded times: (signal, [(first sample, end sample)] of each turn)."""
    rng = np.random.default_rng(seed + 7919)
    x = np.zeros(seconds * rate, dtype=np.float32)
    turns, t = [], rng.uniform(0.05, 0.6)
    while t + 1.0 < seconds:
        length = min(rng.uniform(1.3, 2.6), seconds - t)
        a, n = int(t * rate), int(length * rate)
        burst = speech_like(3, int(rng.integers(1 << 30)), rate)[:n].copy()
        fade = min(n, rate // 50)
        burst[n - fade:] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
        x[a:a + n] = burst
        turns.append((a, a + n))
        t += length + rng.uniform(2.0, 5.0)
    return x, turns


@dataclass
class LoopResult:
    """What one loop left: the signals (sample-aligned), the barge-ins fired and the session's records."""

    played: np.ndarray              # what the speaker played
    scheduled: np.ndarray           # what it would have played without ducking
    mic: np.ndarray                 # what the microphone heard (echo + user + noise)
    clean: np.ndarray               # what the session was given
    echo: np.ndarray                # the echo alone
    fired: List[Tuple[int, int]]    # (fired at, onset at) samples, per barge-in
    records: list
    suppression: List[Optional[float]] = field(default_factory=list)   # the canceller's readout per second
    aec_cost: float = 0.0           # the canceller's wall time per second of audio


def run_loop(cfg: SessionConfig, voice: np.ndarray, path: EchoPath, cancel: bool, reported_delay_ms: float,
             seed: int, quiet: bool = True) -> LoopResult:
    """The session second by second with its speech played through ``path`` back into its input."""
    from engine.stats import progress
    seconds = voice.size // RATE
    s = DuplexSession(cfg)
    s.start()
    aec = EchoCanceller(RATE, enabled=cancel, delay_ms=reported_delay_ms)
    det = BargeInDetector(RATE)
    noise = np.random.default_rng(seed + 104729)
    sig: Dict[str, List[np.ndarray]] = {k: [] for k in ("played", "scheduled", "mic", "clean", "echo")}
    out_prev, prev_second, supp = np.zeros(RATE, dtype=np.float32), -1, []
    with progress(seconds, desc="echo on" if cancel else "echo off", unit="s", quiet=quiet) as bar:
        for k in range(seconds):
            clean_second = []
            for b in range(RATE // BLOCK):
                sched = out_prev[b * BLOCK:(b + 1) * BLOCK]
                play = sched if det.allows(prev_second) else np.zeros(BLOCK, dtype=np.float32)
                playing = det.allows(prev_second) and level_db(out_prev[b * BLOCK:]) > SPEECH_DB
                echo = path(play)
                mic = voice[k * RATE + b * BLOCK: k * RATE + (b + 1) * BLOCK] + echo + \
                    (noise.standard_normal(BLOCK) * MIC_NOISE).astype(np.float32)
                aec.far(play)
                clean = aec.near(mic)
                det.push(clean, playing)
                clean_second.append(clean)
                for name, v in (("played", play), ("scheduled", sched), ("mic", mic), ("clean", clean), ("echo", echo)):
                    sig[name].append(v)
            out_prev, rec = s.process(np.concatenate(clean_second))
            prev_second = k
            supp.append(aec.suppression_db())
            bar.update()
    records = list(s.records)
    s.close()
    return LoopResult(**{k: np.concatenate(v) for k, v in sig.items()},
                      fired=[(b.fired_at, b.onset_at) for b in det.fired], records=records,
                      suppression=supp, aec_cost=aec.cost())
