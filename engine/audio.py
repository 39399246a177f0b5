"""Session audio: any WAV to float32 mono 24 kHz (mixdown, soxr resampling), and one-second frames.

Reading and writing WAV files is :mod:`engine.wavio`'s (PCM 8/16/24/32-bit, IEEE float, extensible,
any channel count; atomic 16-bit writes); bad files raise :class:`AudioError` with one clear message.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from engine.wavio import WavError, read_wav, write_wav  # noqa: F401  (re-exported for callers)

SESSION_RATE = 24000


#: bad or unwritable WAV files (one message naming the file and the reason)
AudioError = WavError


def to_mono(x: np.ndarray) -> np.ndarray:
    """Average the channels of a [frames, channels] (or 1-D) signal into float32 mono."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        return x
    return x.mean(axis=1, dtype=np.float32) if x.shape[1] > 1 else x[:, 0].copy()


def resample(x: np.ndarray, rate_in: int, rate_out: int = SESSION_RATE) -> np.ndarray:
    """Resample a mono float32 signal with soxr (high quality); identity when the rates agree."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if rate_in == rate_out or x.size == 0:
        return x
    import soxr
    return np.ascontiguousarray(soxr.resample(x, rate_in, rate_out, quality="HQ"), dtype=np.float32)


def load_mono(path, rate: int = SESSION_RATE, max_seconds: Optional[float] = None) -> np.ndarray:
    """Read an audio file (any WAV, FLAC, OGG...), mix down to mono and resample to ``rate``: float32 1-D.

    Streamed: with ``max_seconds`` only that much of the file is read. A file without samples is an
    AudioError (a session needs input)."""
    x, r = read_wav(path, max_seconds=max_seconds, need_audio=True)
    return resample(to_mono(x), r, rate)


def frames_of(x: np.ndarray, size: int = SESSION_RATE) -> list:
    """Split a mono signal into whole frames of ``size`` samples (the last one zero-padded)."""
    x = np.asarray(x, dtype=np.float32)
    n = max(1, -(-x.size // size))
    padded = np.zeros(n * size, dtype=np.float32)
    padded[:x.size] = x
    return [padded[i * size:(i + 1) * size].copy() for i in range(n)]


class InputFrames:
    """The one-second frames of an input file at ``rate``, read, mixed down and resampled as they are asked
    for: a 6-hour input costs what a few seconds cost (the whole file is never in memory).

    The frames are those of ``frames_of(load_mono(path, rate, max_seconds))`` bit for bit (soxr's stream
    gives its one-shot samples; at most ``ceil(max_seconds)`` frames). They are produced in order;
    ``frames[k]`` may be asked for again while it is among the last ``keep`` produced (a live runner asks
    for a second's input again when its answer comes back). A bad file is an :class:`AudioError` when it is
    opened (header, size, no samples) or, for a sample that is NaN, when that second is read.
    """

    def __init__(self, path, rate: int = SESSION_RATE, max_seconds: Optional[float] = None,
                 size: int = SESSION_RATE, keep: int = 256):
        from engine.wavio import BLOCK_FRAMES, MAX_SECONDS, open_audio
        self._r = open_audio(path)
        try:
            r = self._r
            if max_seconds is None and r.frames > MAX_SECONDS * r.rate:
                raise WavError(f"{r.path} holds {r.seconds / 3600:.1f} h of audio, more than the 24 h of a "
                               f"session; use a part of it (--seconds)")
            self._left = r.frames if max_seconds is None else min(r.frames, math.ceil(max_seconds * r.rate))
            if self._left == 0:
                raise WavError(f"{r.path} holds no audio samples")
            self._first = r.read(min(BLOCK_FRAMES, self._left))    # a header that claims samples the file lacks
            if len(self._first) == 0:                               # is refused now, not played as silence
                raise WavError(f"{r.path} holds no audio samples (its header claims {r.frames:,}; none can be read)")
        except BaseException:
            self._r.close()
            raise
        out_len = self._left if r.rate == rate else int(self._left * rate / r.rate + 0.5)   # soxr's length
        self._n = max(1, -(-out_len // size))
        if max_seconds is not None:
            self._n = min(self._n, math.ceil(max_seconds))
        self.size, self.keep = size, keep
        self._stream = None
        if r.rate != rate:
            import soxr
            self._stream = soxr.ResampleStream(r.rate, rate, 1, dtype="float32", quality="HQ")
        self._pending = np.zeros(0, dtype=np.float32)
        self._made: dict = {}
        self._next = 0

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        return (self[k] for k in range(self._n))

    def __getitem__(self, k: int) -> np.ndarray:
        if not 0 <= k < self._n:
            raise IndexError(f"frame {k} of {self._n}")
        while self._next <= k:
            self._made[self._next] = self._frame()
            self._made.pop(self._next - self.keep, None)
            self._next += 1
        if k not in self._made:
            raise IndexError(f"frame {k} is no longer kept (the last {self.keep} are)")
        return self._made[k]

    def _frame(self) -> np.ndarray:
        from engine.wavio import BLOCK_FRAMES
        while self._pending.size < self.size and self._left > 0:
            block, self._first = (self._first, None) if self._first is not None else \
                (self._r.read(min(BLOCK_FRAMES, self._left)), None)
            if len(block) == 0:                      # the file shrank: flush what the resampler holds
                self._left = 0
                block = np.zeros((0, 1), dtype=np.float32)
            self._left -= len(block)
            mono = block.mean(axis=1) if block.shape[1] > 1 else block[:, 0]
            if self._stream is not None:
                mono = self._stream.resample_chunk(np.ascontiguousarray(mono, dtype=np.float32),
                                                   last=self._left == 0)
            self._pending = np.concatenate([self._pending, np.asarray(mono, dtype=np.float32)])
        out = np.zeros(self.size, dtype=np.float32)
        n = min(self.size, self._pending.size)
        out[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        if self._left == 0 and self._pending.size == 0:
            self._r.close()
        return out

    def close(self) -> None:
        self._r.close()
