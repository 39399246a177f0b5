"""Atomic file writes: a temporary file in the same folder, then ``os.replace``.

A crash or a full disk never leaves half a file behind, and an unwritable path is one error
(of the caller's class) naming the file and the reason.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Type


def atomic_write(path, write: Callable, error: Type[Exception] = OSError, text: bool = False,
                 sync: bool = False) -> Path:
    """Write through ``write(file)`` into a temporary file next to ``path``, then rename it over
    ``path``. ``text``: open the file as UTF-8 text; ``sync``: fsync before the rename."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    except OSError as e:
        raise error(f"cannot write {path}: {e.strerror or e}") from None
    try:
        mode = {"mode": "w", "encoding": "utf-8", "newline": ""} if text else {"mode": "wb"}
        with os.fdopen(fd, **mode) as f:
            write(f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise error(f"cannot write {path}: {e.strerror or e}") from None
    return path
