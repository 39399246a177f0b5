"""WAV in and out with the stdlib ``wave`` module and numpy; mixdown and resampling with soxr.

The session works on float32 mono 24 kHz. :func:`read_wav` accepts 8/16/24/32-bit PCM at any rate
and channel count; :func:`load_mono` converts it; :func:`write_wav` writes 16-bit PCM (or 32-bit
float samples clipped to [-1, 1] converted to 16-bit). Bad files raise :class:`AudioError` with one
clear message.
"""
from __future__ import annotations

import os
import tempfile
import wave
from pathlib import Path
from typing import Tuple

import numpy as np

SESSION_RATE = 24000


class AudioError(ValueError):
    """A WAV file that cannot be read or written (the message says which and why)."""


def _pcm_to_float(raw: bytes, width: int, channels: int) -> np.ndarray:
    if width == 1:                                     # unsigned 8-bit
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 3:                                   # packed little-endian 24-bit
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        x = v.astype(np.float32) / float(1 << 23)
    elif width == 4:
        x = (np.frombuffer(raw, dtype="<i4").astype(np.float64) / float(1 << 31)).astype(np.float32)
    else:
        raise AudioError(f"unsupported sample width of {width} bytes")
    return x.reshape(-1, channels)                     # [frames, channels]


def read_wav(path) -> Tuple[np.ndarray, int]:
    """Read a PCM WAV file: returns (float32 [frames, channels] in [-1, 1], sample rate)."""
    path = Path(path)
    if not path.is_file():
        raise AudioError(f"cannot read {path}: no such file")
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(n)
    except (wave.Error, EOFError) as e:
        raise AudioError(f"cannot read {path}: not a PCM WAV file ({e})") from None
    if channels < 1 or rate <= 0:
        raise AudioError(f"cannot read {path}: {channels} channels at {rate} Hz")
    usable = len(raw) - len(raw) % (width * channels)
    return _pcm_to_float(raw[:usable], width, channels), rate


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


def load_mono(path, rate: int = SESSION_RATE) -> np.ndarray:
    """Read any PCM WAV, mix down to mono and resample to ``rate``: float32 1-D."""
    x, r = read_wav(path)
    return resample(to_mono(x), r, rate)


def float_to_pcm16(x: np.ndarray) -> bytes:
    x = np.clip(np.asarray(x, dtype=np.float32), -1.0, 1.0)
    return (np.round(x * 32767.0)).astype("<i2").tobytes()


def write_wav(path, x: np.ndarray, rate: int = SESSION_RATE) -> Path:
    """Write a mono (1-D) or [frames, channels] float signal as 16-bit PCM, atomically."""
    path = Path(path)
    x = np.asarray(x, dtype=np.float32)
    channels = 1 if x.ndim == 1 else x.shape[1]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    except OSError as e:
        raise AudioError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f, wave.open(f, "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(2)
            w.setframerate(int(rate))
            w.writeframes(float_to_pcm16(x.reshape(-1)))
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise AudioError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def frames_of(x: np.ndarray, size: int = SESSION_RATE) -> list:
    """Split a mono signal into whole frames of ``size`` samples (the last one zero-padded)."""
    x = np.asarray(x, dtype=np.float32)
    n = max(1, -(-x.size // size))
    padded = np.zeros(n * size, dtype=np.float32)
    padded[:x.size] = x
    return [padded[i * size:(i + 1) * size].copy() for i in range(n)]
