"""A double-talk check for the echo canceller's guard that does not wait for AEC3 to converge.

At the start of double talk AEC3 holds the near end back whole (the user's voice too) for up to ~340 ms
(measured, docs/echo.md). :class:`EchoLevelPredictor` predicts, for each 10 ms microphone frame, the loudest
echo the speaker can be giving now: the far-end level one echo delay earlier (the loudest of the frames a short
room response spreads over that moment) plus the echo path's loss. Both are read from frame energies alone
while the model speaks: the delay is the lag at which microphone level minus far-end level varies least
(an echo-only microphone follows the far end at a constant loss), the loss is a high percentile of that
difference. A microphone frame well above the prediction is the user talking over the speaker. Energies and
percentiles only: no adaptive filter; all echo removal stays AEC3's.
"""
from __future__ import annotations

import collections
from typing import Deque, Optional

import numpy as np

#: far-end frames louder than this (dBFS) are the model speaking
ACTIVE_DB = -50.0
#: the lags tried (10 ms frames: 0-500 ms) and the far-end frames one echo spreads over (a room response)
MAX_LAG = 50
SPREAD = 6
#: the frames the estimate reads (4 s), the fewest it needs, and how often it is redone (frames)
HISTORY = 1000
MIN_FRAMES = 100
EVERY = 10
#: the loss is this percentile of microphone - lagged far-end level over the frames read, or over the newest
#: RECENT of them where that is higher (a speaker turned up: measured, a +6 dB ramp over 2 s let the check take
#: 400 ms of echo for the user while the loss over 10 s lagged behind)
LOSS_PERCENTILE = 75
RECENT = 100
#: levels are floored here for the lag's correlation (the microphone's own noise is about -66 dBFS)
FLOOR_DB = -70.0
#: no estimate from a correlation below this (the far end and the microphone unrelated so far)
MIN_CORRELATION = 0.5
#: the prediction reads the far end this many frames either side of the lag (a lag off by a frame or two)
TOLERANCE = 2


class EchoLevelPredictor:
    """The loudest echo level the far end can be giving in the newest microphone frame (dBFS), or None.

    ``push(far_db, near_db, usable)`` once per 10 ms frame (``usable``: the frame may be echo alone, not one
    already judged the user's); ``predicted_db()`` then reads the newest frame's prediction. ``lag`` (frames)
    and ``loss_db`` are the current estimates (None until ``MIN_FRAMES`` usable frames with the far end
    active).
    """

    def __init__(self) -> None:
        self._far: Deque[float] = collections.deque(maxlen=HISTORY)
        self._near: Deque[float] = collections.deque(maxlen=HISTORY)
        self._use: Deque[bool] = collections.deque(maxlen=HISTORY)
        self._count = 0
        self.lag: Optional[int] = None
        self.loss_db: Optional[float] = None
        self.correlation, self.active_frames = 0.0, 0      # the last estimate's (for the readouts)

    def push(self, far_db: float, near_db: float, usable: bool) -> None:
        self._far.append(far_db)
        self._near.append(near_db)
        self._use.append(bool(usable) and not self._ended_recently())
        self._count += 1
        if self._count % EVERY == 0:
            self._estimate()

    def _ended_recently(self) -> bool:
        """The far end fell silent within the longest lag: the microphone now is the echo's tail, or the user
        who interrupted it (a barge-in silences the speaker), which would tie the user to the far end."""
        far = list(self._far)[-(MAX_LAG + SPREAD):]
        return max(far[-SPREAD:]) <= ACTIVE_DB < max(far)

    def _envelope(self) -> np.ndarray:
        """The far end's running maximum over ``SPREAD`` frames (index i: frames i-SPREAD+1..i)."""
        f = np.asarray(self._far, dtype=np.float64)
        pad = np.concatenate([np.full(SPREAD - 1, -200.0), f])
        return np.max(np.lib.stride_tricks.sliding_window_view(pad, SPREAD), axis=1)

    def _estimate(self) -> None:
        """The lag: the best correlation of microphone level with the lagged far-end level (both floored at
        ``FLOOR_DB``, silences included) over the usable frames; the loss: ``LOSS_PERCENTILE`` of their
        difference where the lagged far end is active."""
        env = np.maximum(self._envelope(), FLOOR_DB)      # env[j]: the far end at the moment of near[j]
        near = np.maximum(np.asarray(self._near, dtype=np.float64)[MAX_LAG:], FLOOR_DB)
        use = np.asarray(self._use, dtype=bool)[MAX_LAG:]
        if int(use.sum()) < MIN_FRAMES:
            return
        far = np.stack([env[MAX_LAG - lag: env.size - lag][use] for lag in range(MAX_LAG + 1)])
        x = near[use] - near[use].mean()
        y = far - far.mean(axis=1, keepdims=True)
        corr = (y @ x) / (np.sqrt(np.sum(y * y, axis=1) * np.sum(x * x)) + 1e-12)
        best = int(np.argmax(corr))
        active = far[best] > ACTIVE_DB
        self.correlation, self.active_frames = float(corr[best]), int(active.sum())
        if corr[best] < MIN_CORRELATION or int(active.sum()) < MIN_FRAMES:
            return
        self.lag = best
        diff = near[use][active] - far[best][active]
        self.loss_db = float(np.percentile(diff, LOSS_PERCENTILE))
        if diff.size >= 2 * RECENT:                       # the echo grown louder lately is the echo now
            self.loss_db = max(self.loss_db, float(np.percentile(diff[-RECENT:], LOSS_PERCENTILE)))

    def predicted_db(self) -> Optional[float]:
        """The loudest echo expected in the newest microphone frame (dBFS), or None before an estimate."""
        if self.lag is None:
            return None
        far = list(self._far)
        lo, hi = max(0, len(far) - self.lag - SPREAD - TOLERANCE), len(far) - max(0, self.lag - TOLERANCE)
        return max(far[lo:hi]) + self.loss_db
