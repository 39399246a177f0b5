"""The NumPy files of the CLIs: reading what users hand in (tokens, codes, prompts) with one clear error
each, and writing decoded audio atomically (:func:`save_audio`)."""
from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from engine.atomic import atomic_write
from engine.safeload import regular_file


#: the largest array a user's file may hold (a day of 25 Hz int64 tokens is 17 MB; a prompt a few MB)
MAX_ARRAY_BYTES = 256 << 20
#: arrays one .npz may hold
MAX_MEMBERS = 64


def _claimed(f, source: str) -> int:
    """Bytes the ``.npy`` header at ``f``'s position says its array holds (the header alone is read)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        shape, _, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0) else fmt.read_array_header_2_0(f))
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as e:
        kind = Path(source.split(" (")[0]).suffix or "NumPy"
        raise ValueError(f"{source}: not a readable {kind} file ({' '.join(str(e).split())[:120]})") from None
    if dtype.hasobject:
        raise ValueError(f"{source}: holds Python objects (pickled); only plain numeric arrays are read")
    return int(math.prod(shape)) * dtype.itemsize


def _check_claims(p: Path, data_bytes: int, max_bytes: int) -> None:
    """Every array's claimed size against the file (and its zip entries) and ``max_bytes``, before any
    array is allocated."""
    def check(claim: int, have: int, source: str) -> None:
        if claim > max_bytes:
            raise ValueError(f"{source} claims an array of {claim:,} bytes, more than the {max_bytes >> 20} MiB a "
                             f"file handed in may hold")
        if claim > have:
            raise ValueError(f"{source} claims an array of {claim:,} bytes but holds {have:,}: the file is "
                             f"truncated or forged")
    with open(p, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"
        if not zipped:
            f.seek(0)
            claim = _claimed(f, str(p))
            check(claim, data_bytes - f.tell(), str(p))
            return
    try:
        with zipfile.ZipFile(p) as z:
            members = z.infolist()
            if len(members) > MAX_MEMBERS:
                raise ValueError(f"{p} holds {len(members)} arrays, more than {MAX_MEMBERS}")
            for m in members:
                with z.open(m) as f:
                    claim = _claimed(f, f"{p} ({m.filename})")
                    check(claim, m.file_size, f"{p} ({m.filename})")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as e:
        raise ValueError(f"{p}: not a readable .npz file ({e})") from None


def load_array(path, what: str, max_bytes: int = MAX_ARRAY_BYTES):
    """``np.load`` of a ``.npy``/``.npz`` named by the user (``what``: "tokens file", "prompt file"...).

    Only a regular file is opened (a FIFO or a device is refused at once); every array's header is
    read first and an array larger than ``max_bytes`` or than the file holds is refused before it is
    allocated. A missing file is a FileNotFoundError naming it; an unreadable one (or one that needs
    pickle) a ValueError naming it. Never unpickles.
    """
    p = Path(path)
    st = regular_file(p, what)
    try:
        _check_claims(p, st.st_size, max_bytes)
        return np.load(p, allow_pickle=False)
    except ValueError as e:
        if str(e).startswith(str(p)):
            raise
        raise ValueError(f"{p}: not a readable {p.suffix or 'NumPy'} file ({e})") from None
    except Exception as e:                                    # noqa: BLE001 — any reader failure
        raise ValueError(f"{p}: not a readable {p.suffix or 'NumPy'} file ({e})") from None


#: what ``save_audio`` writes, by the output's ending
AUDIO_SUFFIXES = (".npy", ".wav")


def save_audio(path, audio: np.ndarray, rate: int) -> Path:
    """A decoded waveform -> ``.npy`` (float32, bit exact) or ``.wav`` (16-bit PCM), atomically.

    The file is written to a temporary file beside ``path``, fsynced, then renamed: a full disk or a
    crash leaves the old file as it was. Audio with NaN or infinite samples is not written (a
    ValueError says how many); an unwritable path is an OSError naming it."""
    p = Path(path)
    x = np.ascontiguousarray(audio, dtype=np.float32)
    bad = int(np.count_nonzero(~np.isfinite(x)))
    if bad:
        raise ValueError(f"the decoder produced {bad} NaN or infinite samples out of {x.size}; {p} was not "
                         f"written (check the weights)")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        return atomic_write(p, lambda f: np.save(f, x, allow_pickle=False), sync=True)
    if suffix == ".wav":
        from engine.wavio import write_wav
        return write_wav(p, x, rate, sync=True)
    raise ValueError(f"{p}: the output must end in {' or '.join(AUDIO_SUFFIXES)}")
