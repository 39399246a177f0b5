"""Audio files in and out: any WAV (and FLAC, OGG, AIFF... through soundfile) in, 16-bit WAV out.

``read_wav`` / :class:`AudioReader` accept what people actually have: PCM 8/16/24/32-bit, IEEE float
32/64-bit and WAVE_FORMAT_EXTENSIBLE parsed here, other WAV encodings and other formats decoded by
libsndfile (``soundfile``), any channel count (mixed down to mono). The input is streamed in blocks,
opened only when it is a regular file (a FIFO never blocks the reader), its size fields are checked
against the file and its samples must be finite; every failure is one :class:`WavError` naming the file.
``write_wav`` writes 16-bit PCM (mono or [frames, channels]) atomically (temporary file, then rename),
so a crash never leaves half a file behind. A session's audio goes to disk as it happens through
:class:`engine.session.journal.GrowingWav` (an hour of 24 kHz audio is 170 MB as 16-bit PCM: not
something to keep in memory).
"""
from __future__ import annotations

import math
import os
import stat
import struct
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from engine.atomic import atomic_write

_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
BLOCK_FRAMES = 1 << 16            # frames decoded at a time while streaming
MAX_CHUNKS = 4096                 # RIFF chunks walked before 'data' (real files have a handful)


class WavError(ValueError):
    """A WAV file that cannot be read or written; the message names the file and the reason."""


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


class AudioReader:
    """An audio file opened for reading in blocks of frames (never read whole).

    WAV files are parsed here: their size fields are checked against the file (a data size of 0 or
    0xFFFFFFFF, what a recorder writing to a pipe leaves, means "up to the end of the file"; a data
    chunk longer than the file is a truncated file and refused). libsndfile would read such a header
    as 0 frames or silently stop early, so it only decodes the WAV encodings this module does not
    (ADPCM, mu-law...) and every other format (FLAC, OGG, AIFF...). Samples must be finite.
    """

    def __init__(self, path):
        self.path = Path(path)
        self._file = _open_regular(self.path)
        self._sf = None
        self._pos = 0
        try:
            head = self._file.read(12)
            wav = len(head) == 12 and head[:4] == b"RIFF" and head[8:12] == b"WAVE"
            layout = _wav_layout(self._file, self.path) if wav else None
            if layout is not None and _plain(layout["tag"], layout["bits"]):
                self.rate, self.channels, self.frames = layout["rate"], layout["channels"], layout["frames"]
                self._tag, self._bits, self._align = layout["tag"], layout["bits"], layout["align"]
                self._file.seek(layout["offset"])
            else:
                self._open_soundfile(layout)
        except BaseException:
            self.close()
            raise
        if self.channels < 1 or self.channels > 1024 or not 1000 <= self.rate <= 1_000_000:
            self.close()
            raise WavError(f"{self.path}: implausible audio header ({self.channels} channels, {self.rate} Hz)")

    def _open_soundfile(self, layout) -> None:
        try:
            import soundfile
        except (ImportError, OSError) as e:          # OSError: the package is there, libsndfile is not
            raise WavError(f"{self.path}: not a PCM or float WAV, and soundfile (libsndfile), which reads the "
                           f"other formats, is unavailable ({e})") from None
        self._file.seek(0)
        try:
            self._sf = soundfile.SoundFile(_SeekSafe(self._file))
        except Exception as e:                       # noqa: BLE001 — libsndfile's reasons vary
            if layout is not None:
                raise WavError(f"{self.path}: unsupported WAV encoding (format tag {layout['tag']}, "
                               f"{layout['bits']} bits); use PCM or float") from None
            reason = getattr(e, "error_string", None) or str(e)
            raise WavError(f"{self.path}: not a WAV file nor another readable audio format "
                           f"(FLAC, OGG, AIFF...): {reason}") from None
        self.rate, self.channels, self.frames = int(self._sf.samplerate), int(self._sf.channels), int(self._sf.frames)

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    def read(self, n: int) -> np.ndarray:
        """Up to ``n`` more frames as float32 [frames, channels] (fewer at the end of the file)."""
        n = max(0, min(int(n), self.frames - self._pos))
        if n == 0:
            return np.zeros((0, self.channels), dtype=np.float32)
        try:
            if self._sf is not None:
                block = self._sf.read(n, dtype="float32", always_2d=True)
            else:
                raw = self._file.read(n * self._align)
                if len(raw) < n * self._align:
                    raise WavError(f"{self.path}: the file ended early (it shrank while being read)")
                block = _decode(raw, self._tag, self._bits, self.path).reshape(-1, self.channels)
        except (OSError, RuntimeError) as e:
            raise WavError(f"cannot read {self.path}: {getattr(e, 'strerror', None) or e}") from None
        bad = ~np.isfinite(block).all(axis=1)
        if bad.any():
            k = self._pos + int(np.argmax(bad))
            raise WavError(f"{self.path}: sample {k} (at {k / self.rate:.3f} s) is NaN or infinite; "
                           f"audio input must be finite")
        self._pos += len(block)
        return block

    def close(self) -> None:
        if self._sf is not None:
            self._sf.close()
        self._file.close()

    def __enter__(self) -> "AudioReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _SeekSafe:
    """The file libsndfile reads through soundfile's callbacks: a seek the file refuses (libsndfile seeks before the
    start of a truncated header) leaves the position as it is instead of raising inside the callback, where
    Python can only print the traceback on stderr; libsndfile then reports the file as unreadable, in one line."""

    def __init__(self, f):
        self._f = f

    def seek(self, offset: int, whence: int = 0) -> int:
        try:
            return self._f.seek(offset, whence)
        except (OSError, ValueError):
            return self._f.tell()

    def __getattr__(self, name):
        return getattr(self._f, name)


def _open_regular(path: Path):
    """Open ``path`` for reading without blocking (a FIFO with no writer) and only if it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise WavError(f"cannot read {path}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file")
        raise WavError(f"cannot read {path}: it is {kind}, not an audio file")
    return os.fdopen(fd, "rb")


def _plain(tag: int, bits: int) -> bool:
    """Encodings decoded here (PCM 8/16/24/32-bit, float 32/64-bit); the rest go to libsndfile."""
    return (tag == _PCM and bits in (8, 16, 24, 32)) or (tag == _FLOAT and bits in (32, 64))


def _wav_layout(f, path: Path) -> dict:
    """Walk the RIFF chunks (seeking, not reading payloads) to 'fmt ' and 'data'; check sizes."""
    size = os.fstat(f.fileno()).st_size
    fmt, pos = None, 12
    for _ in range(MAX_CHUNKS):
        f.seek(pos)
        head = f.read(8)
        if len(head) < 8:
            missing = "'fmt '" if fmt is None else "'data'"
            raise WavError(f"{path}: WAV file lacks a {missing} chunk (or is truncated)")
        cid, csize = struct.unpack("<4sI", head)
        if cid == b"fmt ":
            fmt = f.read(min(csize, 1024))
            if len(fmt) < min(csize, 1024):
                raise WavError(f"{path}: truncated WAV file (it ends inside the 'fmt ' chunk)")
        elif cid == b"data":
            break
        pos += 8 + csize + (csize & 1)
    else:
        raise WavError(f"{path}: more than {MAX_CHUNKS} RIFF chunks before the audio; not a WAV file to read")
    if fmt is None:
        raise WavError(f"{path}: WAV file lacks a 'fmt ' chunk before its 'data'")
    tag, channels, rate, bits = _parse_fmt(fmt, path)
    align = max(1, channels * bits // 8) if bits % 8 == 0 and bits else max(1, struct.unpack_from("<H", fmt, 12)[0])
    start = pos + 8
    left = size - start
    if csize in (0, 0xFFFFFFFF):                 # length unknown (written to a pipe): to the end of the file
        csize = left
    elif csize > left:
        raise WavError(f"{path}: truncated WAV file: its header promises {csize / align / max(rate, 1):.2f} s of "
                       f"audio, the file holds {max(left, 0) / align / max(rate, 1):.2f} s")
    return {"tag": tag, "channels": channels, "rate": rate, "bits": bits, "align": align,
            "offset": start, "frames": csize // align}


def open_audio(path) -> AudioReader:
    """Open an audio file for streaming reads (WAV any encoding, FLAC, OGG, AIFF...); WavError if not."""
    return AudioReader(path)


#: what :func:`read_wav` reads at most without ``max_seconds`` (a day of audio)
MAX_SECONDS = 24 * 3600


def read_wav(path, max_seconds: Optional[float] = None, need_audio: bool = False) -> Tuple[np.ndarray, int]:
    """Read an audio file -> (mono float32 samples, sample rate), streamed in blocks.

    ``max_seconds``: read only that much from the start (a 1 GiB file costs only what is read);
    ``need_audio``: a file without samples is an error. Raises WavError with one message."""
    with AudioReader(path) as r:
        want = r.frames if max_seconds is None else min(r.frames, int(math.ceil(max_seconds * r.rate)))
        if max_seconds is None and r.frames > MAX_SECONDS * r.rate:
            raise WavError(f"{r.path} holds {r.seconds / 3600:.1f} h of audio, more than the 24 h read at once; "
                           f"read a part of it (--seconds)")
        out = np.empty(want, dtype=np.float32)
        got = 0
        while got < want:
            block = r.read(min(BLOCK_FRAMES, want - got))   # [n, channels]
            if len(block) == 0:
                break
            out[got:got + len(block)] = block.mean(axis=1) if r.channels > 1 else block[:, 0]
            got += len(block)
        if need_audio and got == 0:
            raise WavError(f"{r.path} holds no audio samples")
        return out[:got], int(r.rate)

def _pcm16(samples: np.ndarray) -> bytes:
    """float samples -> 16-bit little-endian PCM bytes (clipped to the representable range)."""
    x = np.asarray(samples, dtype=np.float64).reshape(-1)
    return np.clip(np.round(x * 32768.0), -32768, 32767).astype("<i2").tobytes()


def _header(rate: int, nbytes: int, channels: int = 1) -> bytes:
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + nbytes, b"WAVE", b"fmt ", 16, _PCM, channels,
                       int(rate), int(rate) * 2 * channels, 2 * channels, 16, b"data", nbytes)


def write_wav(path, samples: np.ndarray, rate: int, sync: bool = False) -> Path:
    """Write float samples (mono 1-D, or [frames, channels]) as 16-bit PCM clipped to [-1, 1],
    atomically (``sync``: fsynced before the rename). Returns the path."""
    x = np.asarray(samples)
    channels = 1 if x.ndim == 1 else int(x.shape[1])
    pcm = _pcm16(x)                                   # row-major [frames, channels] = interleaved
    return atomic_write(path, lambda f: (f.write(_header(rate, len(pcm), channels)), f.write(pcm)), WavError,
                        sync=sync)
