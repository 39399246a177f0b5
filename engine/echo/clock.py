"""A device's real rate, measured, and the slow servo that keeps a queue where it should be.

Sound cards, USB headsets, Bluetooth links and virtual machines run their sample clocks off the nominal rate
(by parts per million, and by whole percents where a sound server's timer lags). A stream that assumes the
nominal rate drifts: a speaker that plays slower than the engine speaks builds a backlog, one that plays
faster runs dry, and a microphone that runs fast hands the engine more than a second of audio per second.

:class:`RateMeter` reads a stream's callbacks as (time, samples so far) stamps and fits the line through the
last ``window_s`` of them (least squares): its slope is the rate, in samples per second of the clock that
stamped them, taken only where it lies clearly off the nominal rate (three standard errors of the fit).
:class:`LevelServo` turns a queue's level into a small correction of a resampling step, so a
rate measured slightly wrong cannot move the queue away for good.
"""
from __future__ import annotations

import collections
import math
import threading
from typing import Deque, Optional, Tuple

import numpy as np

#: the share of the nominal rate a measured rate may lie within (outside: the stamps are broken, not the clock)
SPEED_RANGE = (0.5, 2.0)
#: a fitted rate is taken only this many standard errors away from the nominal one; within that, the nominal
SIGNIFICANT = 3.0


class RateMeter:
    """A stream's rate from stamps: ``stamp(t, count)`` (seconds, samples moved so far), from any one thread.

    ``rate()`` is the slope of count over time through the stamps of the last ``window_s`` (nominal until
    they span ``min_span_s``); ``speed()`` the same as a share of ``nominal``. Stamps closer than
    ``every_s`` to the last kept one are skipped: a callback may stamp every block at no cost.
    """

    def __init__(self, nominal: float, window_s: float = 30.0, min_span_s: float = 2.0, every_s: float = 0.05):
        if nominal <= 0:
            raise ValueError(f"a rate meter needs a positive nominal rate; got {nominal}")
        self.nominal = float(nominal)
        self.window_s, self.min_span_s, self.every_s = float(window_s), float(min_span_s), float(every_s)
        self._stamps: Deque[Tuple[float, float]] = collections.deque()
        self._lock = threading.Lock()
        self._rate = self.nominal
        self._fitted_at = -math.inf

    def stamp(self, t: float, count: float) -> None:
        with self._lock:
            if self._stamps and t - self._stamps[-1][0] < self.every_s:
                return
            self._stamps.append((float(t), float(count)))
            while self._stamps and t - self._stamps[0][0] > self.window_s:
                self._stamps.popleft()

    def reset(self) -> None:
        """Forget the stamps (a stream restarted): nominal until new ones span ``min_span_s``."""
        with self._lock:
            self._stamps.clear()
            self._rate, self._fitted_at = self.nominal, -math.inf

    @property
    def span_s(self) -> float:
        with self._lock:
            return self._stamps[-1][0] - self._stamps[0][0] if len(self._stamps) > 1 else 0.0

    def rate(self) -> float:
        """Samples per second (nominal until the stamps span ``min_span_s``); refitted at most every 0.25 s."""
        with self._lock:
            if not self._stamps or self._stamps[-1][0] - self._fitted_at < 0.25:
                return self._rate
            s = np.asarray(self._stamps, dtype=np.float64)
        if s[-1, 0] - s[0, 0] < self.min_span_s:
            return self._rate
        t, c = s[:, 0] - s[:, 0].mean(), s[:, 1] - s[:, 1].mean()
        slope = float(np.dot(t, c) / np.dot(t, t))
        if SPEED_RANGE[0] * self.nominal <= slope <= SPEED_RANGE[1] * self.nominal:
            self._rate = slope if self._off_nominal(t, c, slope) else self.nominal
        self._fitted_at = float(s[-1, 0])
        return self._rate

    def _off_nominal(self, t: np.ndarray, c: np.ndarray, slope: float) -> bool:
        """Whether the stamps say the rate is not the nominal one: the slope further from it than
        :data:`SIGNIFICANT` standard errors of the fit (callbacks stamped late by a busy machine put a few
        tenths of a percent into a short fit; resampling a nominal device by that stretches what it records)."""
        n = len(t)
        if n < 3:
            return True
        resid = c - slope * t
        se = math.sqrt(float(np.dot(resid, resid)) / (n - 2) / float(np.dot(t, t)))
        return abs(slope - self.nominal) > SIGNIFICANT * se

    def speed(self) -> float:
        return self.rate() / self.nominal


class LevelServo:
    """A queue's level -> a small relative correction of the step that fills or drains it.

    ``update(level)`` once per measurement (seconds of audio queued, at the same point of every cycle):
    the level is averaged over ``smooth`` updates, and the correction is (average - ``target``, less a
    ``deadband`` either side) / ``time_s``, clipped to +-``limit`` and moved at most ``slew`` per update: a level ``x`` seconds too high
    drains in about ``time_s`` seconds while the pitch changes by at most ``limit`` (0.3 % is 5 cents).
    Positive: take more input per output (drain faster).
    """

    def __init__(self, target: float, time_s: float = 20.0, limit: float = 0.003, slew: float = 0.0005,
                 smooth: int = 8, deadband: float = 0.0):
        self.target, self.time_s, self.limit, self.slew = float(target), float(time_s), float(limit), float(slew)
        self.deadband = float(deadband)
        self._alpha = 1.0 / max(1, int(smooth))
        self.level: Optional[float] = None
        self.correction = 0.0

    def update(self, level: float) -> float:
        self.level = level if self.level is None else self.level + self._alpha * (level - self.level)
        off = self.level - self.target
        off = 0.0 if abs(off) <= self.deadband else off - np.copysign(self.deadband, off)
        want = max(-self.limit, min(self.limit, off / self.time_s))
        self.correction += max(-self.slew, min(self.slew, want - self.correction))
        return self.correction
