"""Recovery of an unfinished journal that never changes it: read, copy into a new folder, verify, then mark.

A journal whose process died is only ever read. Its trusted lines (engine/session/journal_lines.py: a torn,
NUL-filled or corrupt line costs that line alone) and its audio, second by second from byte 44 of each WAV
whatever their headers say, are copied into a fresh folder made beside the destination, so on the
destination's own file system whatever disk the journal is on (nothing is ever renamed from one file
system to another). A second whose record survived keeps it; a second whose audio is missing (a WAV cut
short or gone) is silence in the recovered WAV and is counted as such: a lost WAV costs its audio, never the
records. The copy is then read back and compared with what was meant (every line, the WAV headers, CRCs of
the audio), fsynced, and moved into place as one folder (:func:`engine.session.journal.publish`). Only then
is the journal marked recovered (``session.recovered`` names where it went; ``session.unfinished`` goes).
Any failure before that removes the fresh folder and leaves the journal byte for byte as it was.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from engine.atomic import atomic_write, sync_folder
from engine.wavio import _header

from . import journal as J
from .export import ExportError, to_csv, to_trace
from .journal_lines import Line, read_lines, scan

RECOVERED = "session.recovered"
_HEADER_BYTES = 44
_NPY_HEADER = 128
_BLOCK = 1 << 20
_WAVS = {"input": J.INPUT_WAV, "output": J.OUTPUT_WAV}


@dataclass
class Survey:
    """What a journal holds that can be trusted (read only; nothing is written)."""

    journal: Path
    marker: Dict[str, object]
    rate: int
    lines: List[Line]
    refused: int                                  # non-empty pieces of session.jsonl that were not trusted
    audio: Dict[str, int]                         # whole seconds on disk per WAV ("input" / "output")
    missing: List[str] = field(default_factory=list)   # WAVs that are not there at all
    speech: Optional[int] = None                  # float32 samples in speech.npy (None: no such file)

    @property
    def seconds(self) -> int:
        """Seconds of the recovered WAVs: every second some record or some audio reaches."""
        last = self.lines[-1].at + 1 if self.lines else 0
        return max([last] + list(self.audio.values()))

    def silent(self) -> Dict[str, int]:
        """Per WAV, the seconds of the recovered session that lack its audio (silence in their place)."""
        return {k: self.seconds - min(self.seconds, n) for k, n in self.audio.items() if self.seconds > n}


@dataclass
class Recovery:
    """A finished recovery: where it went and what it holds."""

    folder: Path
    files: Dict[str, Path]
    records: int
    seconds: int
    silent: Dict[str, int]
    missing: List[str]
    refused: int
    unmarked: str = ""                            # why the journal could not be marked recovered ("": it was)

    def describe(self) -> str:
        """One clause for people: what was recovered and what was not."""
        parts = [f"{self.records} record{'s' if self.records != 1 else ''}"]
        if self.refused:
            parts.append(f"{self.refused} unreadable line{'s' if self.refused != 1 else ''} left out")
        for kind, n in self.silent.items():
            gone = "missing" if _WAVS[kind] in self.missing else "cut short"
            parts.append(f"the {kind} audio was {gone}: {n} s of silence in its place")
        return f"recovered {self.seconds} s ({'; '.join(parts)})"


# -- reading (never writes) -------------------------------------------------------------------------

def survey(journal, rate: Optional[int] = None) -> Survey:
    """What the unfinished journal ``journal`` holds; ExportError when it is not one."""
    d = Path(journal)
    marker = J.read_marker(d)
    if marker is None:
        raise ExportError(f"cannot recover {d}: it is not an unfinished session journal")
    rate = int(rate or _journal_rate(d, marker))
    most = (0xFFFFFFFF - 36) // (2 * rate)           # the seconds a WAV's 32-bit sizes can count
    lines, refused = scan(d / J.RECORDS, sealed=marker.get("lines") == "sealed")
    refused += sum(1 for line in lines if line.at >= most)
    lines = [line for line in lines if line.at < most]
    audio, missing = {}, []
    for kind, name in _WAVS.items():
        size = _size(d / name)
        if size is None:
            missing.append(name)
        audio[kind] = min(most, max(0, (size or 0) - _HEADER_BYTES) // (2 * rate))
    speech = _size(d / J.SPEECH)
    speech = None if speech is None else min(max(0, speech - _NPY_HEADER) // 4, 1 << 40)
    return Survey(d, marker, rate, lines, refused, audio, missing, speech)


def _size(path: Path) -> Optional[int]:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def _journal_rate(d: Path, marker: Dict[str, object]) -> int:
    """The journal's audio rate: the marker's, else a WAV header's that reads as the journal's own
    (16-bit mono PCM), else 24 kHz."""
    rate = marker.get("rate")
    if isinstance(rate, int) and not isinstance(rate, bool) and 1 <= rate <= 384_000:
        return rate
    for name in _WAVS.values():
        if _size(d / name) is None:                  # missing or not a regular file: never opened
            continue
        try:
            with open(d / name, "rb") as f:
                head = f.read(_HEADER_BYTES)
        except OSError:
            continue
        if len(head) == _HEADER_BYTES and head[:4] == b"RIFF" and head[8:16] == b"WAVEfmt ":
            tag, channels, r = struct.unpack_from("<HHI", head, 20)
            if tag == 1 and channels == 1 and 1 <= r <= 384_000 and head[34:36] == b"\x10\x00":
                return int(r)
    return J.RATE


# -- writing the copy -------------------------------------------------------------------------------

def _copy_audio(src: Path, dst: Path, rate: int, seconds: int, have: int) -> int:
    """``dst``: a 16-bit mono WAV of ``seconds``, the first ``have`` copied from ``src``'s samples (from byte
    44 on), silence after. Returns the CRC-32 of the samples written."""
    per, crc = 2 * rate, 0
    with open(dst, "xb") as out:
        out.write(_header(rate, per * seconds))
        left = per * min(have, seconds)
        if left:
            with open(src, "rb") as f:
                f.seek(_HEADER_BYTES)
                crc = _copy_bytes(f, out, left, src)
        zeros = bytes(min(_BLOCK, per * seconds) or 1)
        left = per * (seconds - min(have, seconds))
        while left:
            n = min(len(zeros), left)
            crc = zlib.crc32(zeros[:n], crc)
            out.write(zeros[:n])
            left -= n
        _sync(out)
    return crc


def _copy_speech(src: Path, dst: Path, samples: int) -> int:
    """``dst``: speech.npy with the ``samples`` whole float32 values ``src`` holds, its header made to count
    them. Returns the CRC-32 of the values."""
    with open(dst, "xb") as out, open(src, "rb") as f:
        out.write(J.npy_header(samples))
        f.seek(_NPY_HEADER)
        crc = _copy_bytes(f, out, 4 * samples, src)
        _sync(out)
    return crc


def _copy_bytes(f, out, left: int, src: Path, crc: int = 0) -> int:
    """``left`` bytes from ``f`` (at its place) onto ``out``, in blocks; their CRC-32 (from ``crc``)."""
    while left:
        block = f.read(min(_BLOCK, left))
        if not block:
            raise ExportError(f"cannot recover {src}: it shrank while being read")
        crc = zlib.crc32(block, crc)
        out.write(block)
        left -= len(block)
    return crc


def _write_text(path: Path, text: str) -> None:
    with open(path, "x", encoding="utf-8", newline="") as f:
        f.write(text)
        _sync(f)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def _fill(tmp: Path, s: Survey) -> Dict[str, int]:
    """The recovered session's files in ``tmp``; returns the CRC of each audio file's samples."""
    records = [line.record for line in s.lines]
    _write_text(tmp / J.RECORDS, "".join(line.text + "\n" for line in s.lines))
    crcs = {name: _copy_audio(s.journal / name, tmp / name, s.rate, s.seconds, s.audio[kind])
            for kind, name in _WAVS.items()}
    if s.speech is not None:
        crcs[J.SPEECH] = _copy_speech(s.journal / J.SPEECH, tmp / J.SPEECH, s.speech)
    meta = dict(s.marker.get("metadata") or {}) if isinstance(s.marker.get("metadata"), dict) else {}
    meta["recovered"] = {"from": str(s.journal), "records": len(records), "seconds": s.seconds,
                         "unreadable_lines": s.refused, "silent_seconds": s.silent(), "missing": s.missing}
    _write_text(tmp / J.CSV, to_csv(records))
    _write_text(tmp / J.TRACE, to_trace(records, meta))
    return crcs


# -- checking the copy ------------------------------------------------------------------------------

def _verify(tmp: Path, s: Survey, crcs: Dict[str, int]) -> None:
    """Read the copy back: the same lines, WAVs of the right length and header, the same samples."""
    back = read_lines(tmp / J.RECORDS)
    if [(x.at, x.text) for x in back] != [(x.at, x.text) for x in s.lines]:
        raise ExportError(f"cannot recover {s.journal}: the records written to {tmp} read back differently")
    for name in _WAVS.values():
        _check_samples(tmp / name, _header(s.rate, 2 * s.rate * s.seconds), crcs[name])
    if s.speech is not None:
        _check_samples(tmp / J.SPEECH, J.npy_header(s.speech), crcs[J.SPEECH], skip=_NPY_HEADER)


def _check_samples(path: Path, header: Optional[bytes], crc: int, skip: int = _HEADER_BYTES) -> None:
    got = 0
    with open(path, "rb") as f:
        head = f.read(skip)
        if header is not None and head != header:
            raise ExportError(f"cannot recover: {path} has a wrong header after writing")
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            got = zlib.crc32(block, got)
    if got != crc:
        raise ExportError(f"cannot recover: {path} reads back other samples than were written")


# -- the whole recovery -----------------------------------------------------------------------------

def default_destination(journal: Path) -> Path:
    """Where a journal is recovered when no folder is named: ``NAME.recovered`` beside it (NAME: the
    journal's name up to ``.partial-``), or ``NAME.recovered-xxxx`` when that exists."""
    base = journal.name.split(".partial-", 1)[0] or "session"
    first = journal.parent / f"{base}.recovered"
    if not first.exists() and not first.is_symlink():
        return first
    return J.fresh_folder(journal.parent, f"{base}.recovered-")


def recover_journal(journal, dest=None, rate: Optional[int] = None, mark: bool = True) -> Recovery:
    """Recover the unfinished journal ``journal`` into the folder ``dest`` (default:
    :func:`default_destination`); ExportError with one line when it cannot be (the journal is then
    unchanged, and so is ``dest``). ``mark``: then mark the journal recovered (else the caller does,
    with :func:`mark_recovered`, once it has done the rest)."""
    src = Path(journal).expanduser()
    s = survey(src, rate)
    where = Path(dest).expanduser() if dest is not None else None
    if where is not None:
        _check_destination(src, where)
    tmp = None
    try:
        if where is None:
            where = default_destination(src)
        tmp = J.fresh_folder(where.parent, f".{where.name}.recover-")
        _verify(tmp, s, _fill(tmp, s))
        sync_folder(tmp)
        J.publish(tmp, where)
        tmp = None
        sync_folder(where.parent)
    except BaseException as e:                     # a failure or an interrupt: the half-made copy goes
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, OSError) or isinstance(e, ExportError):
            raise
        at = f" ({e.filename})" if getattr(e, "filename", None) else ""
        raise ExportError(f"cannot recover {src} into {where}: {e.strerror or e}{at}; the journal is "
                          f"unchanged") from None
    files = J.files_of(where)
    done = Recovery(where, files, len(s.lines), s.seconds, s.silent(), s.missing, s.refused)
    if mark:
        done.unmarked = mark_recovered(src, where)
    return done


def _check_destination(src: Path, where: Path) -> None:
    real_src, real_dest = os.path.realpath(src), os.path.realpath(where)
    if os.path.commonpath([real_src, real_dest]) == real_src:
        raise ExportError(f"cannot recover {src} into {where}: that is inside the journal; name a folder "
                          f"outside it")
    if where.exists() and not where.is_dir():
        raise ExportError(f"cannot recover {src} into {where}: it is not a folder")


def mark_recovered(journal: Path, into: Path) -> str:
    """Mark ``journal`` recovered: ``session.recovered`` (the old marker plus where it went) replaces
    ``session.unfinished``; where there is no room for a new file, the marker is renamed. Returns ""
    when marked, else why not (the journal then stays unfinished: recovering it again is harmless)."""
    old = journal / J.MARKER
    data = dict(J.read_marker(journal) or {}, recovered_into=str(into), recovered_at=time.time())
    try:
        atomic_write(journal / RECOVERED, lambda f: f.write(json.dumps(data, default=str) + "\n"), text=True,
                     sync=True)
        old.unlink()
        return ""
    except OSError:
        pass
    try:
        os.rename(old, journal / RECOVERED)
        return ""
    except OSError as e:
        return e.strerror or str(e)


def recovered_into(journal) -> Optional[str]:
    """Where a journal marked recovered went (None when it is not marked; "" when the mark does not say)."""
    p = Path(journal) / RECOVERED
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8")[:1 << 16])
    except (OSError, ValueError, RecursionError):
        return ""
    return str(data.get("recovered_into", "")) if isinstance(data, dict) else ""


def recover(directory, dest=None, rate=None):
    """Recover a journal whose process died into the new folder ``dest`` (default: beside it), the journal only
    read, then marked recovered (:func:`recover_journal`)."""
    return recover_journal(directory, dest, rate)
