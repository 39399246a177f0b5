"""Checks on what users type, shared by ``duplexcadence run``, ``synth`` and the app's scripted flags.

Every check fails with one line that names the argument or the path and says what is wrong:

* :class:`OneLineParser` prints argparse errors as one line (``prog: error: ...``), not usage + error;
* :func:`seconds`, :func:`seed`, :func:`count`, :func:`finite` and :func:`nonnegative` are argparse ``type=``
  functions (finite, in range);
* :func:`output_file` / :func:`output_folder` refuse an output that exists and is not what is
  expected (a device node, FIFO, socket, symbolic link; a file where a folder is wanted) and an
  output that is one of the inputs (same inode, so a hard link or a second spelling is caught too).
  These checks hold for root as for anyone else: they look at the file type, not at permissions;
* both refuse, before any work, an output that is a mount point (the final rename cannot replace it)
  or whose nearest existing parent cannot be written: a read-only file system, no permission, or a place
  where nothing can be made at all (``/proc``, ``/sys``: a folder is made there and removed to see);
* an output file's folder must exist (a typo is not made into a new folder); an output folder may be new.
"""
from __future__ import annotations

import argparse
import math
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Iterable, NoReturn, Optional, Sequence

from engine.atomic import not_replaceable

#: the longest session or input the command lines accept (24 hours)
MAX_SECONDS = 24 * 3600.0
#: seeds are stored as signed 64-bit integers (torch, NumPy)
MAX_SEED = 2 ** 63 - 1


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2); every ``type=float`` argument it
    is given takes finite numbers only (:func:`finite`: ``nan`` and ``inf`` are refused, never compared)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def add_argument(self, *args, **kwargs):
        if kwargs.get("type") is float:
            kwargs["type"] = finite
        return super().add_argument(*args, **kwargs)

    def add_argument_group(self, *args, **kwargs):
        group = super().add_argument_group(*args, **kwargs)
        _finite_floats(group)
        return group

    def add_mutually_exclusive_group(self, *args, **kwargs):
        group = super().add_mutually_exclusive_group(*args, **kwargs)
        _finite_floats(group)
        return group


def _finite_floats(group) -> None:
    """A group of a :class:`OneLineParser` whose ``type=float`` arguments take finite numbers only."""
    add = group.add_argument

    def add_argument(*args, **kwargs):
        if kwargs.get("type") is float:
            kwargs["type"] = finite
        return add(*args, **kwargs)
    group.add_argument = add_argument


def finite(text: str) -> float:
    """argparse type: a finite number (``nan``, ``inf`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def nonnegative(text: str) -> float:
    """argparse type: a finite number, 0 or more."""
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; give 0 or more")
    return value


def seconds(text: str) -> float:
    """argparse type: a duration in seconds, finite, > 0 and at most 24 h."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0 or value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range: give seconds greater than 0 and at most {MAX_SECONDS:.0f} (24 h)")
    return value


def seed(text: str) -> int:
    """argparse type: an integer seed in [0, 2**63 - 1]."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer seed") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text} is out of range: a seed is an integer from 0 to 2**63-1")
    return value


def count(text: str) -> int:
    """argparse type: a positive integer (a number of codebooks, of steps...), at most 65536."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 1 << 16:
        raise argparse.ArgumentTypeError(f"{text} is out of range: give a whole number from 1 to 65536")
    return value


def _not_empty(path, what: str, kind: str) -> None:
    """An empty name is no place (``Path("")`` is the current directory): ValueError saying so."""
    if path is None or not str(path).strip():
        raise ValueError(f"{what} is empty; name the {kind} to write")


def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _writable_place(p: Path, what: str) -> None:
    """ValueError unless ``p`` can be written by the rename its writer ends with: not a mount point
    (a rename cannot replace one), and its nearest existing parent a writable folder on a writable
    file system (checked now, before the session, not when the session is over)."""
    try:
        if p.is_dir() and os.path.ismount(p):
            raise ValueError(f"{what} {p} is a mount point: the files are moved into place by a rename, which "
                             f"cannot replace it; name a folder inside it")
    except OSError as e:
        raise ValueError(f"{what} {p}: {e.strerror or e}") from None
    parent = p.parent if str(p.parent) else Path(".")
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {p}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {p}: cannot write into {parent} (read-only or no permission); name a place "
                         f"you can write")
    try:                       # root passes os.access everywhere, and /proc or /sys take no new folder
        os.rmdir(tempfile.mkdtemp(prefix=".duplexcadence-probe-", dir=parent))
    except OSError as e:
        raise ValueError(f"{what} {p}: cannot write into {parent} ({e.strerror or e}); name a place you can "
                         f"write") from None


def output_file(path, what: str, inputs: Iterable[Optional[str]] = (),
                suffixes: Optional[Sequence[str]] = None, new_folder: bool = False) -> Path:
    """Check an output file named by the user before any work is done; ValueError with one line.

    ``inputs``: paths the same run reads (an output may not be one of them); ``suffixes``: the
    endings the writer understands (lower case, with the dot); ``new_folder``: the file's folder may
    not exist yet (a file inside a new output folder), else it must."""
    _not_empty(path, what, "file")
    p = Path(path)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise ValueError(f"{what} {p}: must end in {' or '.join(suffixes)}")
    folder = p.parent if str(p.parent) else Path(".")
    if not new_folder and not folder.is_dir():
        raise ValueError(f"{what} {p}: the folder {folder} does not exist; create it first or name another")
    why = not_replaceable(p)
    if why:
        raise ValueError(f"{what} {p}: {why}")
    _writable_place(p, what)
    for src in inputs:
        if src is not None and _same_file(p, Path(src)):
            raise ValueError(f"{what} {p} is the input file {src}: writing it would destroy the input")
    return p


def output_folder(path, what: str, inputs: Iterable[Optional[str]] = (), names: Sequence[str] = ()) -> Path:
    """Check an output folder: new, or an existing real folder (not a link to one); none of the
    files ``names`` it will hold may be one of ``inputs`` or something other than a regular file."""
    _not_empty(path, what, "folder")
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ValueError(f"{what} {p}: {e.strerror or e}") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise ValueError(f"{what} {p}: it exists and is {kind}; name a new or an existing folder")
    _writable_place(p, what)
    for name in names:
        output_file(p / name, what, inputs, new_folder=True)
    for src in inputs:
        if src is not None and _same_file(p, Path(src)):
            raise ValueError(f"{what} {p} is the input {src}")
    return p


def fail(prog: str, message: str, code: int = 2) -> int:
    """Print ``prog: error: message`` on stderr and return ``code`` (for ``return fail(...)``)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code
