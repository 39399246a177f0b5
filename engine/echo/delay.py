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
mean magnitude); a new delay is taken once two estimates in a row agree on it (within ``AGREE_MS``) and the
reference, moved by it, explains a fair share of the microphone (``ACCEPT_SHARE``: :func:`_explained`).
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
ACTIVE_SHARE = 0.2
ACTIVE_DB = -50.0
#: the peak must stand this many times above the mean magnitude of the lags searched
CONFIDENCE = 10.0
#: two estimates within this (ms) agree (a room response spreads the peak by a few ms)
AGREE_MS = 8.0
#: the phase transform's exponent
BETA = 0.8
#: the speech band the phase transform weighs (Hz)
BAND = (200.0, 4000.0)
#: a delay is taken only where the reference explains this share of the raw microphone's power at it (a peak the
#: user's voice made, in double talk, explains little)
ACCEPT_SHARE = 0.3
#: the canceller's output holds the echo when the reference explains this share of its power or more (measured on
#: speech-like noise through the bench's rooms: pure echo 0.92-0.96; echo under a louder user 0.04-0.16; the
#: user over a working canceller 0.02-0.07; the microphone's noise 0.06-0.12)
HOLDS_REFERENCE = 0.4
#: the coherence's segments (samples)
SEGMENT = 2048


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
        self.estimated = False          # True right after a push that made a confident estimate (``candidate``)
        self.last_confidence = 0.0
        self.last_share = 0.0
        self.ahead = 0                  # samples the echo may come *before* the reference (the bulk held back)

    def share_at(self, lag: int) -> float:
        """The share of the microphone window's power the reference explains at ``lag`` (samples)."""
        m, r = self._window(self._mic).astype(np.float64), self._window(self._ref).astype(np.float64)
        if lag >= 0:
            m, r = m[lag:], r[:r.size - lag]
        else:
            m, r = m[:m.size + lag], r[-lag:]
        return _explained(m, r, self.rate)

    def coherent(self) -> bool:
        """Whether the microphone side of the window is largely the reference (the canceller's output fed as the
        microphone: much echo left in it): the share of its power (200-4000 Hz) the reference explains, at least
        :data:`HOLDS_REFERENCE`. The reference is moved to the lag of the plain cross-correlation's peak, and
        the share is the magnitude-squared coherence of the two (Welch: 2048-sample Hann segments, half
        overlapping) weighted by the microphone's power, so a room's response (shorter than a segment) counts
        whole. Unlike the phase transform's peak this weighs how much of the window the echo is: a residual
        echo well under the user's voice is not a lost echo."""
        self.last_share = 0.0
        if self._filled < self.n or not self._active(ACTIVE_SHARE / 4):
            return False
        m, r = self._window(self._mic).astype(np.float64), self._window(self._ref).astype(np.float64)
        corr = np.fft.irfft(np.fft.rfft(m, self.fft) * np.conj(np.fft.rfft(r, self.fft)), self.fft)
        ahead = min(int(self.ahead), self.max_lag)
        lags = np.concatenate([corr[self.fft - ahead:], corr[:self.max_lag + 1]])
        self.last_share = self.share_at(int(np.argmax(np.abs(lags))) - ahead)
        return self.last_share >= HOLDS_REFERENCE

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
        self.changed = self.estimated = False
        self.listen(ref, mic)
        self._since += ref.size
        if self._filled < self.n or self._since < EVERY_S * self.rate:
            return
        self._since = 0
        lag = self.estimate()
        self.estimated = lag is not None
        if lag is None:
            return
        agree = int(AGREE_MS * self.rate / 1000.0)
        if self.candidate is not None and abs(lag - self.candidate) <= agree:
            if (self.delay is None or abs(lag - self.delay) > agree) and self.share_at(lag) >= ACCEPT_SHARE:
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


def _explained(m: np.ndarray, r: np.ndarray, rate: int) -> float:
    """The share of ``m``'s power in the speech band that ``r`` explains linearly (Welch coherence weighted by
    ``m``'s power)."""
    if m.size < SEGMENT:
        return 0.0
    w = np.hanning(SEGMENT)
    starts = range(0, m.size - SEGMENT + 1, SEGMENT // 2)
    fm = np.stack([np.fft.rfft(m[i:i + SEGMENT] * w) for i in starts])
    fr = np.stack([np.fft.rfft(r[i:i + SEGMENT] * w) for i in starts])
    smr = np.abs(np.mean(fm * np.conj(fr), axis=0)) ** 2
    smm, srr = np.mean(np.abs(fm) ** 2, axis=0), np.mean(np.abs(fr) ** 2, axis=0)
    f = np.fft.rfftfreq(SEGMENT, 1.0 / rate)
    band = (f >= BAND[0]) & (f <= BAND[1])
    msc = smr[band] / (smm[band] * srr[band] + 1e-30)
    return float(np.sum(msc * smm[band]) / (np.sum(smm[band]) + 1e-30))
