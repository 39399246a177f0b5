"""Session audio: any WAV to float32 mono 24 kHz (mixdown, soxr resampling), and one-second frames.

Reading and writing WAV files is :mod:`engine.wavio`'s (PCM 8/16/24/32-bit, IEEE float, extensible,
any channel count; atomic 16-bit writes); bad files raise :class:`AudioError` with one clear message.
"""
from __future__ import annotations

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
