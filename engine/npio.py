"""Reading the NumPy files users hand to the CLIs (tokens, codes, prompts) with one clear error each."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def load_array(path, what: str):
    """``np.load`` of a ``.npy``/``.npz`` named by the user (``what``: "tokens file", "prompt file"...).

    A missing file is a FileNotFoundError naming it; an unreadable one (or one that needs pickle) a
    ValueError naming it. Never unpickles.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} {p} does not exist")
    try:
        return np.load(p, allow_pickle=False)
    except Exception as e:                                    # noqa: BLE001 — any reader failure
        raise ValueError(f"{p}: not a readable {p.suffix or 'NumPy'} file ({e})") from None
