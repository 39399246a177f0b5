"""Voice activity per second: the session measures it, the backbones read it (so it lives below both).

:class:`EnergyVAD` splits a second into 20 ms windows and calls it speech when enough windows
stand clearly above an adaptive noise floor (and above an absolute level, so a silent line never
counts).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.audio import SESSION_RATE


@dataclass
class VadResult:
    """One second's voice activity, as the session hands it to the backbone's LISTEN."""

    speech: bool           # this second holds speech
    active_fraction: float  # share of 20 ms windows above the threshold
    level_db: float        # loudest window, dBFS
    floor_db: float        # the noise floor after this second


class EnergyVAD:
    """Energy voice-activity detector with an adaptive noise floor (no model, no state on the GPU).

    ``min_active`` is the share of 20 ms windows that must be active (0.1 = 100 ms of a second);
    a window is active above ``max(abs_db, floor + margin_db)``.
    """

    def __init__(self, rate: int = SESSION_RATE, window_ms: float = 20.0, abs_db: float = -45.0,
                 margin_db: float = 12.0, min_active: float = 0.1):
        self.win = max(1, int(rate * window_ms / 1000.0))
        self.abs_db, self.margin_db, self.min_active = abs_db, margin_db, min_active
        self.floor_db = -70.0

    def __call__(self, frame: np.ndarray) -> VadResult:
        x = np.asarray(frame, dtype=np.float32)
        n = x.size // self.win
        if n == 0:
            return VadResult(False, 0.0, -120.0, self.floor_db)
        w = x[: n * self.win].reshape(n, self.win).astype(np.float64)
        db = 10.0 * np.log10(np.mean(w * w, axis=1) + 1e-12)          # [windows]
        threshold = max(self.abs_db, self.floor_db + self.margin_db)
        active = float(np.mean(db > threshold))
        quiet = float(np.percentile(db, 10))
        # the floor follows quiet stretches down at once and rises only slowly (speech is not noise)
        self.floor_db = quiet if quiet < self.floor_db else self.floor_db + 0.1 * (quiet - self.floor_db)
        return VadResult(active >= self.min_active, active, float(db.max()), self.floor_db)
