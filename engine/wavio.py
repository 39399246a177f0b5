"""WAV files in and out, without extra dependencies.

``read_wav`` accepts what people actually have: PCM 8/16/24/32-bit, IEEE float 32/64-bit and
WAVE_FORMAT_EXTENSIBLE, any channel count (mixed down to mono). ``write_wav`` writes 16-bit PCM
(mono or [frames, channels]) atomically (temporary file, then rename), so a crash never leaves half a file behind.
:class:`WavSpool` collects a session's audio on disk as it happens (an hour of 24 kHz audio is
170 MB as 16-bit PCM: not something to keep in memory) and saves it as a WAV on export.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
import threading
from pathlib import Path
from typing import Tuple

import numpy as np

from engine.atomic import atomic_write

_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


class WavError(ValueError):
    """A WAV file that cannot be read or written; the message names the file and the reason."""


def _chunks(data: bytes, path: Path):
    """Yield (id, payload) for every RIFF chunk after the 12-byte header."""
    pos = 12
    while pos + 8 <= len(data):
        cid, size = struct.unpack_from("<4sI", data, pos)
        yield cid, data[pos + 8: pos + 8 + size]
        pos += 8 + size + (size & 1)


def _parse_fmt(fmt: bytes, path: Path) -> Tuple[int, int, int, int]:
    """-> (format tag, channels, sample rate, bits per sample)."""
    if len(fmt) < 16:
        raise WavError(f"{path}: broken 'fmt ' chunk")
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", fmt)
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack_from("<H", fmt, 24)[0]   # first two bytes of the sub-format GUID
    return tag, channels, rate, bits


def _decode(raw: bytes, tag: int, bits: int, path: Path) -> np.ndarray:
    """Sample bytes -> float32 in [-1, 1] (flat, interleaved)."""
    if tag == _FLOAT and bits in (32, 64):
        return np.frombuffer(raw[: len(raw) // (bits // 8) * (bits // 8)],
                             dtype="<f4" if bits == 32 else "<f8").astype(np.float32)
    if tag != _PCM:
        raise WavError(f"{path}: unsupported WAV encoding (format tag {tag}); use PCM or float")
    if bits == 8:
        return (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if bits == 16:
        return np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
    if bits == 24:
        b = np.frombuffer(raw[: len(raw) // 3 * 3], dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        return v.astype(np.float32) / float(1 << 23)
    if bits == 32:
        return np.frombuffer(raw[: len(raw) // 4 * 4], dtype="<i4").astype(np.float32) / 2147483648.0
    raise WavError(f"{path}: unsupported PCM sample size {bits} bits")


def read_wav(path) -> Tuple[np.ndarray, int]:
    """Read a WAV file -> (mono float32 samples, sample rate). Raises WavError with one message."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WavError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise WavError(f"{path} is not a WAV file (no RIFF/WAVE header)")
    fmt = raw = None
    for cid, payload in _chunks(data, path):
        if cid == b"fmt ":
            fmt = payload
        elif cid == b"data":
            raw = payload
    if fmt is None or raw is None:
        raise WavError(f"{path}: WAV file lacks a {'fmt ' if fmt is None else 'data'} chunk")
    tag, channels, rate, bits = _parse_fmt(fmt, path)
    if channels < 1 or rate < 1000:
        raise WavError(f"{path}: implausible WAV header ({channels} channels, {rate} Hz)")
    flat = _decode(raw, tag, bits, path)
    frames = flat[: len(flat) // channels * channels].reshape(-1, channels)   # (n, channels)
    mono = frames.mean(axis=1) if channels > 1 else frames[:, 0]
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate)


def _pcm16(samples: np.ndarray) -> bytes:
    """float samples -> 16-bit little-endian PCM bytes (clipped to the representable range)."""
    x = np.asarray(samples, dtype=np.float64).reshape(-1)
    return np.clip(np.round(x * 32768.0), -32768, 32767).astype("<i2").tobytes()


def _header(rate: int, nbytes: int, channels: int = 1) -> bytes:
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + nbytes, b"WAVE", b"fmt ", 16, _PCM, channels,
                       int(rate), int(rate) * 2 * channels, 2 * channels, 16, b"data", nbytes)


def write_wav(path, samples: np.ndarray, rate: int) -> Path:
    """Write float samples (mono 1-D, or [frames, channels]) as 16-bit PCM clipped to [-1, 1],
    atomically. Returns the path."""
    x = np.asarray(samples)
    channels = 1 if x.ndim == 1 else int(x.shape[1])
    pcm = _pcm16(x)                                   # row-major [frames, channels] = interleaved
    return atomic_write(path, lambda f: (f.write(_header(rate, len(pcm), channels)), f.write(pcm)), WavError)


class WavSpool:
    """Mono audio appended as 16-bit PCM to an anonymous temporary file; ``save`` makes a WAV.

    One thread appends, any thread may save (a lock keeps them apart). The file disappears when
    the spool is closed or garbage-collected.
    """

    def __init__(self, rate: int):
        self.rate = int(rate)
        self._file = tempfile.TemporaryFile(prefix="duplexcadence-", suffix=".pcm")
        self._lock = threading.Lock()
        self.samples = 0

    def append(self, samples: np.ndarray) -> None:
        pcm = _pcm16(samples)
        with self._lock:
            self._file.seek(0, os.SEEK_END)
            self._file.write(pcm)
            self.samples += len(pcm) // 2

    def read(self) -> np.ndarray:
        """Everything so far as float32 (for tests and short sessions)."""
        with self._lock:
            self._file.seek(0)
            raw = self._file.read()
        return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0

    def save(self, path) -> Path:
        """Write what was appended so far as a WAV file, atomically."""
        path = Path(path)

        def write(f):
            with self._lock:
                f.write(_header(self.rate, self.samples * 2))
                self._file.seek(0)
                shutil.copyfileobj(self._file, f, 1 << 20)
        return atomic_write(path, write, WavError)

    def close(self) -> None:
        self._file.close()
