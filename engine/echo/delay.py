"""The echo path's delay, measured from the signals, so a delay that jumps never reaches the canceller.

A speaker that underruns, a sound server that re-syncs, a Bluetooth link that re-buffers: the delay from
the reference to its echo in the microphone jumps by tens to hundreds of milliseconds, and AEC3 takes seconds
to find the new one (measured, docs/echo.md: 120 -> 250 ms, 3-6 s at 3-8 dB of suppression; 250 -> 80 ms,
about 20 s). :class:`DelayTracker` measures the delay every half second by the phase transform of the cross
spectrum (GCC-PHAT) of the last two seconds of the reference and the raw microphone (each under a Hann window:
the edges of a rectangular one are the same in both and, whitened, peak at lag 0), weighted to the speech band
(200-4000 Hz): the peak of

    r(tau) = IFFT( W(f) * M(f) conj(F(f)) / |M(f) conj(F(f))|^BETA ),   -ahead <= tau <= MAX_LAG

is the lag at which the microphone holds the reference, whatever the room did to its spectrum (``BETA`` a
little under 1 keeps the bins that hold only noise from weighing as much as the speech; measured on the echo
bench, 1.0 locked onto spurious lags in double talk where 0.8 did not). An estimate counts only when the
reference was active in most of the window and the peak stands well above the rest (``CONFIDENCE`` times the
mean magnitude); a new delay is taken once two estimates in a row agree on it (within ``AGREE_MS``).
When the canceller lost the echo, the audio path delays the reference itself
(:meth:`engine.echo.align.FarAligner.set_bulk`) so AEC3 sees at most :data:`TARGET_MS`; while it holds the
reference back that way, lags down to ``-ahead`` (the bulk) are searched too: a path that got shorter than
the bulk puts the echo ahead of its reference, where only a smaller bulk can find it again.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

#: the longest delay AEC3 is left to find after a re-align (ms): its own estimator found every path of 30-250 ms
#: (docs/echo.md); 150 leaves room for the path to get shorter again by as much before the echo would come
#: ahead of its reference
TARGET_MS = 150.0
#: the longest delay looked for (ms)
MAX_LAG_MS = 800.0
#: seconds read per estimate, and how often one is made
WINDOW_S = 2.0
EVERY_S = 0.5
#: the reference must be active (above ACTIVE_DB in 20 ms frames) in this share of the window
ACTIVE_SHARE = 0.4
ACTIVE_DB = -50.0
#: the peak must stand this many times above the mean magnitude of the lags searched
CONFIDENCE = 10.0
#: two estimates within this (ms) agree (a room response spreads the peak by a few ms)
AGREE_MS = 8.0
#: the phase transform's exponent
BETA = 0.8
#: the speech band the phase transform weighs (Hz)
BAND = (200.0, 4000.0)


class DelayTracker:
    """``push(ref, mic)`` per block (the same length, at ``rate``); ``delay`` is the accepted delay in samples
    (None before the first), ``changed`` True right after a push that moved it."""

    def __init__(self, rate: int, window_s: float = WINDOW_S):
        self.rate = int(rate)
        self.n = int(window_s * self.rate)
        self.fft = 1 << int(np.ceil(np.log2(2 * self.n)))
        self.max_lag = int(MAX_LAG_MS * self.rate / 1000.0)
        f = np.fft.rfftfreq(self.fft, 1.0 / self.rate)
        self._band = ((f >= BAND[0]) & (f <= BAND[1])).astype(np.float64)
        self._hann = np.hanning(self.n)
        self._ref = np.zeros(self.n, dtype=np.float32)   # rings of the last ``n`` samples, written at _at
        self._mic = np.zeros(self.n, dtype=np.float32)
        self._at = 0
        self._filled = 0
        self._since = 0
        self.delay: Optional[int] = None
        self.candidate: Optional[int] = None
        self.estimates = 0
        self.changed = False
        self.last_confidence = 0.0
        self.ahead = 0                  # samples the echo may come *before* the reference (the bulk held back)

    def coherent(self) -> bool:
        """Whether the microphone side of the window holds the reference now (a clear peak), whatever the
        estimates so far (the canceller's output fed as the microphone: echo left in it)."""
        return self._filled >= self.n and self.estimate(ACTIVE_SHARE / 4) is not None

    def listen(self, ref: np.ndarray, mic: np.ndarray) -> None:
        """Keep the window (no estimate): :meth:`coherent` reads it on demand."""
        ref, mic = ref[-self.n:], mic[-self.n:]
        k = ref.size
        first = min(k, self.n - self._at)
        self._ref[self._at:self._at + first], self._mic[self._at:self._at + first] = ref[:first], mic[:first]
        self._ref[:k - first], self._mic[:k - first] = ref[first:], mic[first:]
        self._at = (self._at + k) % self.n
        self._filled += k

    def restart(self) -> None:
        """The reference moved (re-aligned): forget the window and the delay, measure anew."""
        self._filled = self._since = 0
        self.delay = self.candidate = None
        self.changed = False

    def _window(self, ring: np.ndarray) -> np.ndarray:
        """The ring in time order (oldest first)."""
        return np.concatenate([ring[self._at:], ring[:self._at]])

    def push(self, ref: np.ndarray, mic: np.ndarray) -> None:
        self.changed = False
        self.listen(ref, mic)
        self._since += ref.size
        if self._filled < self.n or self._since < EVERY_S * self.rate:
            return
        self._since = 0
        lag = self.estimate()
        if lag is None:
            return
        agree = int(AGREE_MS * self.rate / 1000.0)
        if self.candidate is not None and abs(lag - self.candidate) <= agree:
            if self.delay is None or abs(lag - self.delay) > agree:
                self.delay, self.changed = lag, True
        self.candidate = lag

    def _active(self, share: float) -> bool:
        w = self.rate // 50
        k = self.n // w
        db = 10.0 * np.log10(np.mean(np.square(self._ref[:k * w].reshape(k, w), dtype=np.float64), axis=1) + 1e-12)
        return float(np.mean(db > ACTIVE_DB)) >= share      # the ring's order does not matter here

    def estimate(self, share: float = ACTIVE_SHARE) -> Optional[int]:
        """The lag (samples) of the strongest phase-transform peak, or None (the reference active in less
        than ``share`` of the window, no clear peak)."""
        self.last_confidence = 0.0
        if not self._active(share):
            return None
        self.estimates += 1
        m = np.fft.rfft(self._window(self._mic) * self._hann, self.fft)
        r = np.fft.rfft(self._window(self._ref) * self._hann, self.fft)
        cross = m * np.conj(r)
        cross = cross / (np.abs(cross) ** BETA + 1e-12) * self._band
        corr = np.fft.irfft(cross, self.fft)
        ahead = min(int(self.ahead), self.max_lag)
        mag = np.abs(np.concatenate([corr[self.fft - ahead:], corr[:self.max_lag + 1]]))   # lags -ahead..max
        lag = int(np.argmax(mag)) - ahead
        self.last_confidence = float(mag[lag + ahead] / (np.mean(mag) + 1e-12))
        return lag if self.last_confidence >= CONFIDENCE else None
