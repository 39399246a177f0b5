"""The session journal: every second goes to disk as it happens, so an interrupted session loses nothing.

A journal is one folder. From the first second on it holds

* ``session.jsonl`` — one JSON line per processed second, appended and flushed at once (a reader
  can follow it while it grows; a crash loses at most the line being written); each line carries its
  place in the WAVs and its own CRC-32 (engine/session/journal_lines.py), so a reader trusts every
  line on its own;
* ``session_input.wav`` / ``session_output.wav`` — what the engine heard and what it said, 24 kHz
  16-bit mono, appended second by second with the header rewritten after every second, so each
  file is a valid WAV at every second boundary (and, after a crash mid-write, recoverable by its
  length);
* ``session.unfinished`` — the marker of a session in progress (JSON: pid, start time, metadata).

Everything is flushed to the OS every second (a killed process loses nothing); ``fsync`` runs at
most every ``sync_every_s`` seconds and at the end, which keeps the cost per second negligible
while bounding what a power cut can take. :meth:`SessionJournal.finish` writes the rest
(``session.csv``, ``session.trace.json``, optionally ``summary.json``) and removes the marker;
:func:`recover` builds the same from a journal whose process died, in a new folder, without changing
the journal (engine/session/recovery.py). :func:`export_journal` copies a
journal into a fresh folder beside the destination and renames it into place, so an export is
whole or absent and never mixes two sessions' files.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from engine import safeload
from engine.audio import SESSION_RATE
from engine.wavio import _header, _pcm16

from .export import ExportError, to_csv, to_trace
from .journal_lines import read_lines, seal
from .records import SecondRecord

RATE = SESSION_RATE
MARKER = "session.unfinished"
RECORDS = "session.jsonl"
INPUT_WAV = "session_input.wav"
OUTPUT_WAV = "session_output.wav"
CSV = "session.csv"
TRACE = "session.trace.json"
SUMMARY = "summary.json"
SPEECH = "speech.npy"
#: every file a journal or an export may hold; an export replaces exactly these names
SESSION_FILES = (CSV, RECORDS, TRACE, INPUT_WAV, OUTPUT_WAV, SUMMARY, SPEECH)
_HEADER_BYTES = 44
#: the most of a marker file that is read (it holds a pid, a time and the session's config)
MARKER_CAP = 1 << 20


class _GrowingFile:
    """An audio file that is valid after every :meth:`append`: the samples go to the end, then the header is
    rewritten to count them. A kind says how samples are encoded (:meth:`_encode`) and its header."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.samples = 0
        self._f = open(self.path, "w+b")          # created with the umask's mode
        self._f.write(self._header())

    def _header(self) -> bytes:
        raise NotImplementedError

    def _encode(self, samples: np.ndarray) -> Tuple[bytes, int]:
        raise NotImplementedError

    def append(self, samples: np.ndarray) -> None:
        """Append samples [T] and make the header count them."""
        data, n = self._encode(samples)
        self._f.seek(0, os.SEEK_END)
        self._f.write(data)
        self.samples += n
        self._f.seek(0)
        self._f.write(self._header())
        self._f.flush()

    def sync(self) -> None:
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            self._f.close()


class GrowingNpy(_GrowingFile):
    """A 1-D float32 ``.npy`` file (a fixed 128-byte header whose shape is rewritten each time): what the
    decoder tail produced, every second concatenated."""

    HEADER = 128

    def _header(self) -> bytes:
        return npy_header(self.samples)

    def _encode(self, samples: np.ndarray) -> Tuple[bytes, int]:
        data = np.ascontiguousarray(samples, dtype="<f4").reshape(-1)
        return data.tobytes(), int(data.size)


def npy_header(samples: int) -> bytes:
    """The fixed 128-byte header of a 1-D float32 ``.npy`` file of ``samples`` values."""
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % int(samples)
    body = text.ljust(GrowingNpy.HEADER - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode("latin1")


class GrowingWav(_GrowingFile):
    """A 16-bit mono WAV file (samples clipped to 16 bits)."""

    def __init__(self, path: Path, rate: int = RATE):
        self.rate = int(rate)
        super().__init__(path)

    def _header(self) -> bytes:
        return _header(self.rate, self.samples * 2)

    def _encode(self, samples: np.ndarray) -> Tuple[bytes, int]:
        pcm = _pcm16(samples)
        return pcm, len(pcm) // 2


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


def fresh_folder(parent: Path, prefix: str) -> Path:
    """A new empty folder ``parent/PREFIXxxxxxxxx`` created with the umask's mode (not 0700)."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    while True:
        p = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            os.mkdir(p)
            return p
        except FileExistsError:
            continue


class SessionJournal:
    """One session's records and audio on disk, appended second by second (see the module doc).

    ``SessionJournal.create(folder, metadata)`` starts one in a new or empty folder; one thread
    calls :meth:`append` per processed second; :meth:`finish` completes it, :meth:`discard`
    deletes it. Errors are :class:`ExportError` naming the file and the reason.
    """

    def __init__(self, directory: Path, rate: int = RATE, sync_every_s: float = 5.0):
        self.directory = Path(directory)
        self.rate = int(rate)
        self.sync_every_s = float(sync_every_s)
        self.records: List[SecondRecord] = []
        self.metadata: Dict[str, object] = {}
        self.finished = False
        self._jsonl = None
        self._wavs: Dict[str, GrowingWav] = {}
        self._last_sync = time.monotonic()

    @classmethod
    def create(cls, directory, metadata: Optional[Dict[str, object]] = None, rate: int = RATE,
               sync_every_s: float = 5.0) -> "SessionJournal":
        """Start a journal in ``directory`` (created; it must be new or empty)."""
        j = cls(Path(directory), rate, sync_every_s)
        j.metadata = dict(metadata or {})
        d = j.directory
        try:
            d.mkdir(parents=True, exist_ok=True)
            if any(d.iterdir()):
                raise ExportError(f"cannot start a session journal in {d}: the folder is not empty")
            (d / MARKER).write_text(json.dumps({"pid": os.getpid(), "started": time.time(), "rate": j.rate,
                                                "lines": "sealed", "metadata": j.metadata}, default=str) + "\n")
            j._jsonl = open(d / RECORDS, "w", encoding="utf-8", newline="\n")
            j._wavs = {"input": GrowingWav(d / INPUT_WAV, rate), "output": GrowingWav(d / OUTPUT_WAV, rate)}
        except OSError as e:
            j.close()
            raise ExportError(f"cannot start a session journal in {d}: {e.strerror or e}") from None
        return j

    @property
    def seconds(self) -> int:
        return len(self.records)

    def append(self, record: SecondRecord, heard: np.ndarray, said: np.ndarray,
               speech: Optional[np.ndarray] = None) -> None:
        """Second ``record.index``: its input [T] and output [T] audio, then its record line; ``speech``
        (what the tail produced this second, float32 at 24 kHz, before levelling or queueing) goes on
        ``speech.npy``.

        The audio goes first, so the records never count a second whose audio is not on disk.
        """
        try:
            self._wavs["input"].append(heard)
            self._wavs["output"].append(said)
            if speech is not None:                  # made with the first second that hands it over
                if "speech" not in self._wavs:
                    self._wavs["speech"] = GrowingNpy(self.directory / SPEECH)
                self._wavs["speech"].append(speech)
            self._jsonl.write(seal(record, len(self.records)) + "\n")
            self._jsonl.flush()
            self.records.append(record)
            if time.monotonic() - self._last_sync >= self.sync_every_s:
                self._sync()
        except OSError as e:
            raise ExportError(f"cannot write the session journal in {self.directory}: {e.strerror or e}") from None

    def append_speech(self, speech: np.ndarray) -> None:
        """Speech the tail made after the last second (a reply's held-back last chunk) onto ``speech.npy``."""
        if not np.asarray(speech).size:
            return
        try:
            if "speech" not in self._wavs:
                self._wavs["speech"] = GrowingNpy(self.directory / SPEECH)
            self._wavs["speech"].append(speech)
        except OSError as e:
            raise ExportError(f"cannot write the session journal in {self.directory}: {e.strerror or e}") from None

    def _sync(self) -> None:
        os.fsync(self._jsonl.fileno())
        for w in self._wavs.values():
            w.sync()
        self._last_sync = time.monotonic()

    def close(self) -> None:
        """Close the files (the journal stays as it is on disk)."""
        if self._jsonl is not None and not self._jsonl.closed:
            self._jsonl.close()
        for w in self._wavs.values():
            w.close()

    def finish(self, summary: Optional[Dict[str, object]] = None,
               metadata: Optional[Dict[str, object]] = None) -> Dict[str, Path]:
        """Write ``session.csv``, ``session.trace.json`` (and ``summary.json`` when given), sync
        everything and remove the marker. Returns the journal's files by kind."""
        if self.finished:
            return files_of(self.directory)
        try:
            if self._jsonl is not None and not self._jsonl.closed:
                self._sync()
            self.close()
            if metadata is not None:
                self.metadata = dict(metadata)
            _write_rest(self.directory, self.records, self.metadata, summary)
            (self.directory / MARKER).unlink(missing_ok=True)
        except OSError as e:
            raise ExportError(f"cannot finish the session journal in {self.directory}: {e.strerror or e}") from None
        self.finished = True
        return files_of(self.directory)

    def discard(self) -> None:
        """Delete the journal folder and everything in it."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.finished = True


def _write_rest(d: Path, records: Sequence[SecondRecord], metadata: Dict[str, object],
                summary: Optional[Dict[str, object]]) -> None:
    with open(d / CSV, "w", encoding="utf-8", newline="") as f:
        f.write(to_csv(records))
    with open(d / TRACE, "w", encoding="utf-8") as f:
        f.write(to_trace(records, metadata))
    if summary is not None:
        with open(d / SUMMARY, "w", encoding="utf-8") as f:
            f.write(json.dumps(summary, indent=2, default=str) + "\n")
    for name in (CSV, TRACE) + ((SUMMARY,) if summary is not None else ()):
        with open(d / name, "rb") as f:
            os.fsync(f.fileno())


def files_of(directory) -> Dict[str, Path]:
    """The session files present in a journal or export folder, by kind."""
    d = Path(directory)
    kinds = {"csv": CSV, "jsonl": RECORDS, "trace": TRACE, "input_wav": INPUT_WAV, "output_wav": OUTPUT_WAV,
             "summary": SUMMARY}
    return {k: d / n for k, n in kinds.items() if (d / n).is_file()}


# -- unfinished journals: find, recover --------------------------------------------------------------

@dataclass
class UnfinishedJournal:
    """A journal whose session never finished (its process died or was killed)."""

    directory: Path
    started: float
    pid: int
    seconds: int                                 # complete record lines on disk
    metadata: Dict[str, object] = field(default_factory=dict)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started)) if self.started else "unknown time"
        return f"a session started {when}, {self.seconds} s recorded ({self.directory})"


def read_marker(directory) -> Optional[Dict[str, object]]:
    """The marker's content, {} when unreadable, None when the journal is not unfinished."""
    m = Path(directory) / MARKER
    if not m.is_file():
        return None
    try:
        with open(m, "rb") as f:
            raw = f.read(MARKER_CAP + 1)
        if len(raw) > MARKER_CAP:
            return {}
        data = safeload.parse_json(raw, str(m), max_depth=16)          # depth measured before parsing
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def read_records(path) -> List[SecondRecord]:
    """The trusted lines of a ``session.jsonl`` as records, in the order of their seconds (a torn or
    corrupt line is left out, and only that line: engine/session/journal_lines.py)."""
    return [line.record for line in read_lines(path)]


def unfinished_journals(root) -> List[UnfinishedJournal]:
    """Journals under ``root`` (its direct subfolders) left unfinished by a process that is gone."""
    root = Path(root)
    found: List[UnfinishedJournal] = []
    if not root.is_dir():
        return found
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        marker = read_marker(d)
        if marker is None:
            continue
        try:
            pid = int(marker.get("pid") or 0)
        except (TypeError, ValueError):
            pid = 0
        if pid and pid != os.getpid() and _pid_alive(pid):
            continue                                 # another running app owns it
        found.append(UnfinishedJournal(d, float(marker.get("started", 0) or 0), pid,
                                       len(read_records(d / RECORDS)), dict(marker.get("metadata") or {})))
    return found


# -- exports: whole or absent ----------------------------------------------------------------------

def publish(src: Path, dest: Path) -> Path:
    """Move the finished folder ``src`` to ``dest`` (same file system) without mixing two sessions.

    A new ``dest`` is a rename. An existing ``dest`` holding only session files is swapped out
    (renamed aside, then removed). A folder with other files of the user's keeps them: the session
    files are renamed in one by one and session files this export lacks are removed.
    """
    src, dest = Path(src), Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ExportError(f"cannot write {dest / CSV}: {dest} is not a folder")
    if not dest.exists() and not dest.is_symlink():
        os.rename(src, dest)
        return dest
    if not dest.is_symlink() and all(p.name in SESSION_FILES for p in dest.iterdir()):
        old = dest.parent / f".{dest.name}.old-{secrets.token_hex(4)}"
        os.rename(dest, old)
        os.rename(src, dest)
        shutil.rmtree(old, ignore_errors=True)
        return dest
    names = {p.name for p in src.iterdir()}
    for name in names:
        os.replace(src / name, dest / name)
    for name in set(SESSION_FILES) - names:
        if (dest / name).is_file():
            (dest / name).unlink()
    src.rmdir()
    return dest


def export_folder(dest, fill) -> Dict[str, Path]:
    """Fill a fresh folder beside ``dest`` with ``fill(folder)``, then :func:`publish` it as ``dest``.

    A failure removes the fresh folder and raises one :class:`ExportError`; ``dest`` is untouched.
    """
    dest = Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise ExportError(f"cannot write {dest / CSV}: {dest} is not a folder")
    tmp = None
    try:
        tmp = fresh_folder(dest.parent, f".{dest.name}.export-")
        fill(tmp)
        publish(tmp, dest)
    except OSError as e:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, ExportError):
            raise
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        raise ExportError(f"cannot export to {dest}: {e.strerror or e}{where}") from None
    return files_of(dest)


def export_journal(directory, dest) -> Dict[str, Path]:
    """Copy a finished journal's files into ``dest`` (whole or not at all; files get the umask's mode)."""
    src = Path(directory)

    def fill(tmp: Path) -> None:
        for name in SESSION_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)
    return export_folder(dest, fill)
