"""What the user says and hears, on one wall clock: the scrolling waveforms and the delay a person feels.

No Qt here: the frame pump (its worker thread) reports each input block and the moment each
one-second frame is complete; the controller (GUI thread) reports each answer second as it is
queued for playback, with the seconds already queued ahead of it. From these :class:`AudioMonitor`
keeps

* two :class:`Envelope` s — min/max per 20 ms column of the microphone (as the engine hears it,
  after the push-to-talk gate) and of the model's speech, placed at the moment it *plays*; a plot
  draws the last few seconds of both and the delay is visible as the gap between them;
* the mic-to-speaker delay of every second: from the moment its input frame was complete to the
  moment its answer starts playing (the answer is ready, then waits behind the audio queued ahead
  of it). Without an output device it is the delay until the answer is ready.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable, Dict, Optional, Tuple

import numpy as np

#: seconds of audio the scrolling waveforms keep
SCOPE_SPAN_S = 8.0


class Envelope:
    """Min/max of a signal per ``col_s`` column of wall-clock time, for the last ``span_s`` seconds.

    ``add`` may come from any thread; columns live in a ring indexed by absolute column number,
    so a view costs the same however long the session runs.
    """

    def __init__(self, span_s: float = SCOPE_SPAN_S, col_s: float = 0.02):
        self.col_s = float(col_s)
        self.span_cols = int(round(span_s / col_s))
        n = self.span_cols + int(round(4.0 / col_s))          # room for up to 4 s queued ahead of now
        self._lo = np.zeros(n, dtype=np.float32)
        self._hi = np.zeros(n, dtype=np.float32)
        self._col = np.full(n, -1, dtype=np.int64)
        self._lock = threading.Lock()

    def add(self, t0: float, samples: np.ndarray, rate: float) -> None:
        """Place ``samples`` [N] at ``rate`` Hz starting at wall time ``t0`` (seconds)."""
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if not len(x):
            return
        cols = np.floor((t0 + np.arange(len(x)) / float(rate)) / self.col_s).astype(np.int64)   # [N]
        starts = np.flatnonzero(np.r_[True, cols[1:] != cols[:-1]])                            # [C]
        lo, hi, c = np.minimum.reduceat(x, starts), np.maximum.reduceat(x, starts), cols[starts]
        keep = slice(max(0, len(c) - len(self._col)), None)          # never two columns in one slot
        lo, hi, c = lo[keep], hi[keep], c[keep]
        slot = c % len(self._col)
        with self._lock:
            same = self._col[slot] == c                                # a column continued by this block
            self._lo[slot] = np.where(same, np.minimum(self._lo[slot], lo), lo)
            self._hi[slot] = np.where(same, np.maximum(self._hi[slot], hi), hi)
            self._col[slot] = c

    def view(self, now: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x [C] seconds relative to ``now`` (<= 0), lo [C], hi [C]) of the last ``span_s``; 0 where empty."""
        c_now = int(math.floor(now / self.col_s))
        want = np.arange(c_now - self.span_cols + 1, c_now + 1, dtype=np.int64)
        slot = want % len(self._col)
        with self._lock:
            valid = self._col[slot] == want
            lo = np.where(valid, self._lo[slot], 0.0)
            hi = np.where(valid, self._hi[slot], 0.0)
        return (want - c_now) * self.col_s, lo, hi


#: the spectrogram's rate, FFT size and hop (16 kHz: 0-8 kHz shown; 32 ms windows, 16 ms hops)
SPEC_RATE, SPEC_N, SPEC_HOP = 16000, 512, 256


class _Tail:
    """The last ``n`` samples of a stream at SPEC_RATE, thread-safe. Other rates are brought to SPEC_RATE by
    linear interpolation (for the picture only; no resampler object outlives the session)."""

    def __init__(self, n: int):
        self.buf = np.zeros(n, dtype=np.float32)
        self.total = 0
        self._phase = 0.0                 # where the next output sample falls in the next input block
        self._last = 0.0
        self._lock = threading.Lock()

    def _to_spec_rate(self, x: np.ndarray, rate: int) -> np.ndarray:
        if rate == SPEC_RATE or not len(x):
            return x
        step = rate / SPEC_RATE
        pos = np.arange(self._phase, len(x), step)
        y = np.interp(pos, np.arange(-1, len(x)), np.r_[self._last, x]).astype(np.float32)
        self._phase = (pos[-1] + step - len(x)) if len(pos) else self._phase - len(x)
        self._last = float(x[-1])
        return y

    def add(self, x: np.ndarray, rate: int) -> None:
        y = self._to_spec_rate(x, int(rate))[-len(self.buf):]
        n, size = len(y), len(self.buf)
        with self._lock:                       # a ring: the newest sample ends at ``total % size``
            start = self.total % size
            first = min(n, size - start)
            self.buf[start:start + first] = y[:first]
            self.buf[:n - first] = y[first:]
            self.total += n

    def copy(self) -> np.ndarray:
        """The last ``n`` samples in time order (the newest last)."""
        with self._lock:
            return self._linear()

    def _linear(self) -> np.ndarray:
        cut = self.total % len(self.buf)
        return np.concatenate([self.buf[cut:], self.buf[:cut]])


def spectrogram(x: np.ndarray, n: int = SPEC_N, hop: int = SPEC_HOP, floor_db: float = -100.0) -> np.ndarray:
    """[frames, n // 2 + 1] power in dB of Hann-windowed frames of ``x`` (numpy rfft, cheap: ~0.3 ms/s)."""
    frames = 1 + max(0, (len(x) - n) // hop)
    idx = np.arange(n)[None, :] + hop * np.arange(frames)[:, None]
    seg = x[idx] * np.hanning(n).astype(np.float32)
    p = np.abs(np.fft.rfft(seg, axis=1)) ** 2 / (n * 0.375 * n / 4)
    return np.maximum(10.0 * np.log10(p + 1e-20), floor_db).astype(np.float32)


class _Rolling:
    """A stream's spectrogram over its last ``frames`` hops, updated with only the hops that are new."""

    def __init__(self, tail: _Tail, frames: int):
        self.tail = tail
        self.image = np.full((frames, SPEC_N // 2 + 1), -100.0, dtype=np.float32)
        self.done = 0                          # samples of the stream already transformed (whole hops)

    def update(self) -> np.ndarray:
        with self.tail._lock:
            total, buf = self.tail.total, self.tail._linear()
            hops = min((total - self.done) // SPEC_HOP, len(self.image))
            need = (hops - 1) * SPEC_HOP + SPEC_N if hops > 0 else 0
            end = len(buf) - (total - self.done - hops * SPEC_HOP)
            x = buf[max(0, end - need):end].copy() if hops > 0 and end >= need else None
        if x is None:
            self.done = total - (total - self.done) % SPEC_HOP if hops > 0 else self.done
            return self.image
        new = spectrogram(x)
        self.image = np.concatenate([self.image[len(new):], new])
        self.done += hops * SPEC_HOP
        return self.image


class Spectra:
    """The last ``span_s`` of the microphone (as the engine hears it) and of the model's speech (as it
    played), for the spectrogram; :meth:`images` transforms only what is new since the last call."""

    def __init__(self, span_s: float = SCOPE_SPAN_S):
        self.span_s = float(span_s)
        self.mic = _Tail(int(span_s * SPEC_RATE))
        self.speech = _Tail(int(span_s * SPEC_RATE))
        frames = int(span_s * SPEC_RATE) // SPEC_HOP
        self._rolls = (_Rolling(self.mic, frames), _Rolling(self.speech, frames))

    def add_mic(self, x: np.ndarray, rate: int) -> None:
        self.mic.add(np.asarray(x, dtype=np.float32).reshape(-1), rate)

    def add_speech(self, x: np.ndarray, rate: int) -> None:
        self.speech.add(np.asarray(x, dtype=np.float32).reshape(-1), rate)

    def images(self) -> Tuple[np.ndarray, np.ndarray]:
        """(microphone, speech) spectrograms [frames, bins] in dB, the newest hop last."""
        return self._rolls[0].update(), self._rolls[1].update()


class AudioMonitor:
    """Input/output envelopes and the mic-to-speaker delay per second (see the module docstring)."""

    def __init__(self, span_s: float = SCOPE_SPAN_S, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.mic = Envelope(span_s)
        self.speech = Envelope(span_s)
        self.spectra = Spectra(span_s)
        self._captured: Dict[int, float] = {}        # frame index -> wall time its last sample arrived
        self.delay_ms: Dict[int, float] = {}         # second index -> mic-to-speaker delay
        self.playing = False                         # the latest answer went to an output device
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._captured.clear()
            self.delay_ms.clear()
        self.mic = Envelope(self.mic.span_cols * self.mic.col_s)
        self.speech = Envelope(self.speech.span_cols * self.speech.col_s)
        self.spectra = Spectra(self.spectra.span_s)

    # -- the frame pump's thread -----------------------------------------------------------
    def on_block(self, block: np.ndarray, rate: int) -> None:
        """A block of input that just arrived (it ends now)."""
        self.mic.add(self.clock() - len(block) / float(rate), block, rate)
        self.spectra.add_mic(block, rate)

    def on_played(self, block: np.ndarray, rate: int) -> None:
        """What the speaker's callback played (drained on the pump's thread): what was actually heard, so
        speech dropped as late or by a barge-in is never drawn."""
        self.speech.add(self.clock() - len(block) / float(rate), block, rate)
        self.spectra.add_speech(block, rate)

    def on_frame(self, index: int) -> None:
        """Frame ``index`` is complete and goes to the engine now."""
        with self._lock:
            self._captured[index] = self.clock()

    # -- the GUI thread ---------------------------------------------------------------------
    def on_answer(self, index: int, audio: np.ndarray, rate: int, queued_ahead_s: Optional[float]) -> float:
        """Second ``index``'s answer is ready now; ``queued_ahead_s`` is the audio queued before it
        (None: no output device). Returns its delay in ms (NaN when its frame was never seen)."""
        now = self.clock()
        starts = now + (queued_ahead_s or 0.0)
        self.playing = queued_ahead_s is not None
        if not self.playing:                         # no device: drawn when ready (a device draws what it played)
            self.speech.add(starts, audio, rate)
            self.spectra.add_speech(audio, rate)
        with self._lock:
            captured = self._captured.pop(index, None)
            if captured is None:
                return float("nan")
            delay = (starts - captured) * 1000.0
            self.delay_ms[index] = delay
        return delay

    def delay_for(self, index: int) -> Optional[float]:
        with self._lock:
            return self.delay_ms.get(index)
