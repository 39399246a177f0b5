"""A streaming resampler whose ratio may change between any two calls (a device's measured rate, servoed).

soxr's streams keep one ratio for their whole life; following a device's clock needs a ratio that moves a
little every block. :class:`VariableResampler` is band-limited interpolation written out: output sample ``m``
sits at input position ``p_m`` (``p_{m+1} = p_m + step``, ``step`` = input samples per output sample) and is

    y[m] = sum_k x[k] * g(p_m - k),   g(t) = fc * sinc(fc * t) * kaiser(t / K),   |t| < K

with the cutoff ``fc = CUTOFF * min(1, 1 / step)`` (cycles per input sample, relative to Nyquist), so
decimation removes what would alias. ``g`` is tabulated at ``PHASES`` phases per input sample, one row of taps per phase,
each row normalised to sum to 1 (unit gain at DC whatever the phase); an output's taps interpolate linearly
between the two nearest rows. The position carries across calls, so a ratio changed between two calls changes
the spacing of the next outputs only: the waveform stays continuous (no click). Latency: ``K`` input samples;
none while the step is exactly 1 (a copy; leaving it later waits ``K`` samples once).
"""
from __future__ import annotations

import math

import numpy as np

#: half the filter length, in input samples (64 taps with the Kaiser window below: an error of -80 dB at 0.75 of
#: the lower Nyquist rate, measured against an exact sine; 2 % of one core per 10 s of 48 kHz -> 24 kHz)
K = 32
#: the passband edge as a share of the lower of the two Nyquist rates
CUTOFF = 0.94
#: the Kaiser window's beta
BETA = 8.0
#: table points per input sample (linear interpolation between them)
PHASES = 256


def _kernel_table(fc: float) -> np.ndarray:
    """[PHASES + 1, 2K]: row j holds the taps of an output at fractional position j / PHASES past its base
    sample (tap i reads ``x[base - K + 1 + i]``, at distance ``j / PHASES + K - 1 - i``), each row summing
    to 1."""
    frac = np.arange(PHASES + 1, dtype=np.float64)[:, None] / PHASES
    t = frac + (K - 1 - np.arange(2 * K, dtype=np.float64))[None, :]
    w = np.i0(BETA * np.sqrt(np.clip(1.0 - (t / K) ** 2, 0.0, 1.0))) / np.i0(BETA)
    g = fc * np.sinc(fc * t) * w
    return g / g.sum(axis=1, keepdims=True)


class VariableResampler:
    """Mono float32 in, float32 out; ``process(x, step)`` with ``step`` input samples per output sample.

    ``nominal_step`` is what a caller that does not servo passes (``rate_in / rate_out``). The number of
    outputs per call follows from the step and the samples available (the last ``K`` inputs wait for their
    successors). ``position`` is the input position of the next output (for tests and alignment).
    """

    def __init__(self, rate_in: float, rate_out: float):
        if rate_in <= 0 or rate_out <= 0:
            raise ValueError(f"resampling needs positive rates; got {rate_in} -> {rate_out}")
        self.nominal_step = float(rate_in) / float(rate_out)
        self._fc = None
        self._table = None
        self.reset()

    def reset(self) -> None:
        """Forget the stream (the next input sample is the first)."""
        self._x = np.zeros(K - 1, dtype=np.float64)     # history before the first sample: silence
        self._p = float(K - 1)                           # the next output's input position in self._x
        self.consumed = 0.0                              # input samples behind the next output, in all

    @property
    def position(self) -> float:
        return self.consumed

    def _coefficients(self, frac: np.ndarray, fc: float) -> np.ndarray:
        if self._fc is None or abs(fc - self._fc) > 0.005 * self._fc:
            self._fc, self._table = fc, _kernel_table(fc)
        idx = frac * PHASES
        i0 = np.minimum(idx.astype(np.int64), PHASES - 1)
        a = (idx - i0)[:, None]
        return self._table[i0] * (1.0 - a) + self._table[i0 + 1] * a

    def process(self, x: np.ndarray, step: float = None) -> np.ndarray:
        """Feed input samples; returns the outputs that now have all their taps."""
        step = self.nominal_step if step is None else float(step)
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"the resampling step must be positive; got {step}")
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        buf = np.concatenate([self._x, x]) if x.size else self._x
        copy = step == 1.0 and self._p == math.floor(self._p)
        last = buf.size - 1 - (0 if copy else K)         # the last position whose taps are all there
        n = int(math.floor((last - self._p) / step)) + 1 if last >= self._p else 0
        if n <= 0:
            self._x = buf
            return np.zeros(0, dtype=np.float32)
        pos = self._p + step * np.arange(n, dtype=np.float64)
        if copy:
            y = buf[pos.astype(np.int64)]
        else:
            base = np.floor(pos).astype(np.int64)
            windows = np.lib.stride_tricks.sliding_window_view(buf, 2 * K)[base - K + 1]
            y = np.einsum("ij,ij->i", self._coefficients(pos - base, CUTOFF * min(1.0, 1.0 / step)), windows)
        p_next = self._p + step * n
        keep = int(math.floor(p_next)) - K + 1           # the first sample the next output's taps read
        self.consumed += p_next - self._p
        self._x, self._p = buf[keep:], p_next - keep
        return y.astype(np.float32)
