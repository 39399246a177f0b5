"""The NumPy files of the CLIs: reading what users hand in (tokens, codes, prompts) with one clear error
each, and writing decoded audio atomically (:func:`save_audio`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.atomic import atomic_write


def load_array(path, what: str):
    """``np.load`` of a ``.npy``/``.npz`` named by the user (``what``: "tokens file", "prompt file"...).

    A missing file is a FileNotFoundError naming it; an unreadable one (or one that needs pickle) a
    ValueError naming it. Never unpickles.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} {p} does not exist or is not a regular file")
    try:
        return np.load(p, allow_pickle=False)
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
