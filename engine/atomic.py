"""Atomic file writes: a temporary file in the same folder, then ``os.replace``.

A crash or a full disk never leaves half a file behind, and an unwritable path is one error
(of the caller's class) naming the file and the reason. Only a new path or an existing regular
file is ever replaced: a device node, FIFO, socket, symbolic link or folder at the target is
refused (as root, ``os.replace`` would otherwise turn ``/dev/null`` into a regular file). A new
file gets the mode the umask allows (``0666 & ~umask``, as ``open()`` would give it); a file that
is replaced keeps its permission bits.
"""
from __future__ import annotations

import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Callable, Optional, Type

_umask_lock = threading.Lock()


class _Refused(Exception):
    """The target turned into something that must not be replaced while the file was written."""


def current_umask() -> int:
    """The process umask (read from /proc where it is shown, else set and restored under a lock)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def not_replaceable(path) -> Optional[str]:
    """Why ``path`` must not be replaced by a regular file (None when it is new or a regular file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror or str(e)
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return None
    kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device node" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    return f"it exists and is {kind}; name a new file or a regular file"


def _final_mode(path: Path) -> int:
    """Permission bits for the written file: the replaced file's, else what the umask allows."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~current_umask()


def atomic_write(path, write: Callable, error: Type[Exception] = OSError, text: bool = False,
                 sync: bool = False) -> Path:
    """Write through ``write(file)`` into a temporary file next to ``path``, then rename it over
    ``path``. ``text``: open the file as UTF-8 text; ``sync``: fsync the file (and its folder)
    so the rename is durable. Raises ``error`` with one line when ``path`` is not a new path or a
    regular file, or when anything fails; the old file is then left as it was."""
    path = Path(path)
    why = not_replaceable(path)
    if why:
        raise error(f"cannot write {path}: {why}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    except OSError as e:
        raise error(f"cannot write {path}: {e.strerror or e}") from None
    try:
        mode = {"mode": "w", "encoding": "utf-8", "newline": ""} if text else {"mode": "wb"}
        with os.fdopen(fd, **mode) as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), _final_mode(path))
            if sync:
                os.fsync(f.fileno())
        why = not_replaceable(path)                  # something else may have appeared meanwhile
        if why:
            raise _Refused(why)
        os.replace(tmp, path)
        if sync:
            sync_folder(path.parent)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, (OSError, _Refused)):
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise error(f"cannot write {path}: {reason}") from None
        raise
    return path


def sync_folder(folder: Path) -> None:
    """fsync a folder so a rename in it survives a crash (best effort: not every system allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
