"""A simulated room's echo path: what a microphone hears of a speaker beside it, without any device.

Not a model of a particular room: a delay, a gain and a short seeded room impulse response (a direct path and
an exponentially decaying diffuse tail). The app's ``--simulate-echo`` (app/loopback.py) plays the model's
speech through it back into the input; ``duplexcadence-bench echo`` (engine/bench/echo_sim.py) does the same
headless.
"""
from __future__ import annotations

import numpy as np

from engine.audio import SESSION_RATE


def room_response(seed: int, rate: int = SESSION_RATE, tail_ms: float = 40.0) -> np.ndarray:
    """A short room impulse response of unit energy: a direct path, then a decaying diffuse tail."""
    rng = np.random.default_rng(seed)
    n = int(rate * tail_ms / 1000.0)
    h = rng.standard_normal(n) * np.exp(-np.arange(n) / (rate * rng.uniform(0.006, 0.012))) * 0.5
    h[0] = 1.0
    return (h / np.sqrt(np.sum(h * h))).astype(np.float64)


class EchoPath:
    """What the microphone hears of the speaker: ``delay_ms`` later, ``gain_db`` quieter, through a room."""

    def __init__(self, delay_ms: float, gain_db: float, seed: int, rate: int = SESSION_RATE):
        self.h = room_response(seed, rate) * 10.0 ** (gain_db / 20.0)
        self.delay = int(round(delay_ms * rate / 1000.0))
        self.hist = np.zeros(self.delay + self.h.size - 1, dtype=np.float64)

    def __call__(self, played: np.ndarray) -> np.ndarray:
        self.hist = np.concatenate([self.hist, played.astype(np.float64)])
        n = played.size
        seg = self.hist[self.hist.size - n - self.delay - self.h.size + 1: self.hist.size - self.delay]
        self.hist = self.hist[n:]
        return np.convolve(seg, self.h, mode="valid").astype(np.float32)
