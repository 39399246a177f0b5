"""How the app's sessions live and end: where journals go, threads that die, and Unix signals.

* ``sessions_root()`` — the folder of session journals: ``$DUPLEXCADENCE_SESSIONS`` or
  ``~/.local/share/DuplexCadence/sessions`` (``$XDG_DATA_HOME``; the generic data folder elsewhere),
  scripted runs in its ``scripted/`` subfolder. Each session journals into its own subfolder; the
  newest ``KEEP_FINISHED`` finished ones of each kind are kept for ``KEEP_DAYS`` days at most (so a
  stopped session can still be exported or reopened from File → Recent sessions), older ones are
  removed when a new session starts; unfinished ones are left for the window to offer to recover.
* ``install_thread_guard()`` — an uncaught exception in any Python thread (an audio thread, the
  pump, the engine) or one PortAudio reports from its callback becomes one line in
  ``THREAD_FAILURES``; the session controller stops the session with it. No traceback is printed.
* :class:`SignalBridge` — SIGINT and SIGTERM become a Qt signal on the GUI thread (through
  ``signal.set_wakeup_fd`` and a socket notifier, so they are seen even while Qt's event loop
  sleeps in C++).
* :class:`SessionDialogs` — the window's questions: Export / Discard / Cancel when a running session
  is closed, and Recover / Discard / Later for a session whose process died.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Deque, Dict, List, Optional

from PySide6.QtCore import QObject, QSocketNotifier, QStandardPaths, Signal
from PySide6.QtWidgets import QMessageBox

from engine.session import ExportError
from engine.audio import SESSION_RATE
from engine.session.journal import MARKER, OUTPUT_WAV, RECORDS, SessionJournal, fresh_folder, unfinished_journals
from engine.session.recovery import recover

#: finished sessions kept (interactive and scripted runs each their own count) and for how long at most
KEEP_FINISHED = 20
KEEP_DAYS = 30
#: scripted runs (demos, tests, screenshots) journal apart, so they never push out the user's sessions
SCRIPTED = "scripted"
#: one line per thread that died since the session started (read by the controller's timer)
THREAD_FAILURES: Deque[str] = collections.deque(maxlen=100)


def sessions_root(scripted: bool = False) -> Path:
    """Where the app keeps session journals: ``$DUPLEXCADENCE_SESSIONS``, else
    ``$XDG_DATA_HOME/DuplexCadence/sessions`` (``~/.local/share/DuplexCadence/sessions`` on Linux; the
    platform's generic data folder elsewhere); scripted runs in its ``scripted/`` subfolder."""
    env = os.environ.get("DUPLEXCADENCE_SESSIONS")
    if env:
        root = Path(env).expanduser()
    else:
        base = QStandardPaths.writableLocation(QStandardPaths.GenericDataLocation)
        root = Path(base or Path.home() / ".local" / "share") / "DuplexCadence" / "sessions"
    return root / SCRIPTED if scripted else root


def finished_sessions(root: Path) -> List[Path]:
    """Finished journals directly under ``root``, newest first."""
    try:
        done = [d for d in Path(root).iterdir() if d.is_dir() and not (d / MARKER).exists()
                and (d / "session.jsonl").exists()]
        done.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    except OSError:
        return []
    return done


def recent_sessions(limit: int = 10) -> List[Path]:
    """The newest finished sessions, interactive and scripted, for File → Recent sessions."""
    both = finished_sessions(sessions_root()) + finished_sessions(sessions_root(scripted=True))
    try:
        both.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    except OSError:
        pass
    return both[:limit]


def session_label(folder: Path) -> str:
    """A kept session as a person reads it: when it started, how long it ran and with which model, e.g.
    "Sat 7 Dec 2026 04:41 · 42 s · step-audio2 + synthetic" (from the folder's name, its output WAV's
    length and its first record; each part left out when it cannot be read)."""
    folder = Path(folder)
    try:
        when = time.strptime(folder.name[:15], "%Y%m%d-%H%M%S")
    except ValueError:
        try:
            when = time.localtime(folder.stat().st_mtime)
        except OSError:
            when = None
    parts = [time.strftime("%a %d %b %Y %H:%M", when).replace(" 0", " ", 1)] if when else [folder.name]
    try:
        samples = ((folder / OUTPUT_WAV).stat().st_size - 44) // 2     # 16-bit mono after a 44-byte header
        parts.append(f"{samples / SESSION_RATE:.0f} s")
    except OSError:
        pass
    try:
        with open(folder / RECORDS, encoding="utf-8") as f:
            first = json.loads(f.readline() or "{}")
        if first.get("tail") and first.get("backbone"):
            parts.append(f"{first['tail']} + {first['backbone']}")
    except (OSError, ValueError, AttributeError):
        pass
    return " · ".join(parts)


def prune_finished(root: Path, keep: int = KEEP_FINISHED, max_age_days: float = KEEP_DAYS) -> None:
    """Remove finished journals under ``root`` beyond the newest ``keep`` or older than ``max_age_days``
    (never unfinished ones, never the ``scripted/`` folder: it is pruned on its own)."""
    now = time.time()
    for i, d in enumerate(finished_sessions(root)):
        try:
            old = now - d.stat().st_mtime > max_age_days * 86400.0
        except OSError:
            continue
        if i >= keep or old:
            shutil.rmtree(d, ignore_errors=True)


def new_journal(root: Path, metadata: Dict[str, object]) -> SessionJournal:
    """A journal for a new session in a fresh folder under ``root`` (ExportError with one line)."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        prune_finished(root, KEEP_FINISHED - 1)
        folder = fresh_folder(root, time.strftime("%Y%m%d-%H%M%S-"))
    except OSError as e:
        raise ExportError(f"cannot keep the session's journal in {root}: {e.strerror or e}") from None
    return SessionJournal.create(folder, metadata)


# -- threads that die --------------------------------------------------------------------------------

def _thread_hook(args) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "a thread"
    THREAD_FAILURES.append(f"{name} stopped: {args.exc_type.__name__}: {args.exc_value}")


def _unraisable_hook(u) -> None:
    msg = u.err_msg or ""
    if "callback" in msg.lower():                 # cffi/PortAudio audio callbacks
        THREAD_FAILURES.append(f"an audio callback failed: {type(u.exc_value).__name__}: {u.exc_value}")
    else:
        _previous_unraisable(u)


_previous_unraisable = sys.unraisablehook


def install_thread_guard() -> None:
    """Route uncaught thread and audio-callback exceptions to ``THREAD_FAILURES`` (idempotent)."""
    threading.excepthook = _thread_hook
    if sys.unraisablehook is not _unraisable_hook:
        globals()["_previous_unraisable"] = sys.unraisablehook
        sys.unraisablehook = _unraisable_hook


# -- Unix signals ------------------------------------------------------------------------------------

class SignalBridge(QObject):
    """SIGINT/SIGTERM -> ``received(signum)`` on the GUI thread. ``uninstall`` restores the old state."""

    received = Signal(int)
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._rsock, self._wsock = socket.socketpair()
        for s in (self._rsock, self._wsock):
            s.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, self._python_handler) for s in self.SIGNALS}
        self._notifier = QSocketNotifier(self._rsock.fileno(), QSocketNotifier.Read, self)
        self._notifier.activated.connect(self._drain)
        self.first: Optional[int] = None

    @staticmethod
    def _python_handler(signum, frame) -> None:
        """Runs whenever Python gets control; the byte on the wakeup fd wakes Qt."""

    def _drain(self) -> None:
        try:
            data = self._rsock.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        for b in data:
            if b in self.SIGNALS:
                if self.first is None:
                    self.first = int(b)
                self.received.emit(int(b))

    def uninstall(self) -> None:
        self._notifier.setEnabled(False)
        for s, h in self._old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(self._old_fd)
        self._rsock.close()
        self._wsock.close()


# -- the window's questions: closing a running session, recovering a dead one ---------------------

class SessionDialogs:
    """Mixed into the main window: what closing a running session does, and the recovery of sessions
    whose process died. ``ask_*`` and ``choose_folder`` are the only places that show a dialog (tests
    replace them)."""

    def ask_close(self) -> str:
        """Ask what to do with the running session: "export", "discard" or "cancel"."""
        box = QMessageBox(QMessageBox.Question, "A session is running",
                          "A session is running. Export it before closing?", parent=self)
        box.setInformativeText("The session stops at the end of the second in progress.")
        export = box.addButton("Export…", QMessageBox.AcceptRole)
        discard = box.addButton("Discard", QMessageBox.DestructiveRole)
        box.addButton(QMessageBox.Cancel)
        box.setDefaultButton(export)
        box.exec()
        return {export: "export", discard: "discard"}.get(box.clickedButton(), "cancel")

    def choose_folder(self, title: str) -> str:
        """A folder from the user: an existing one or a typed new one, created ("" when cancelled)."""
        from app.folder_dialog import choose_new_or_existing_folder
        return choose_new_or_existing_folder(self, title, self.settings.export_dir)

    # -- recovery of a session whose process died -------------------------------------------------
    def offer_recovery(self, root=None) -> int:
        """For each unfinished session journal left by a process that died, ask: recover it (finish it
        from the journal, then export it) or discard it, or later. Returns how many were recovered."""
        recovered = 0
        for j in unfinished_journals(root if root is not None else sessions_root()):
            choice = self.ask_recover(j)
            if choice == "discard":
                shutil.rmtree(j.directory, ignore_errors=True)
                self.events.add("session", f"discarded {j.describe()}")
                continue
            if choice != "recover":
                continue
            folder = self.choose_folder("Recover the session into…")
            try:                                  # the journal is only read; it is marked once the copy is whole
                done = recover(j.directory, folder or None)
            except ExportError as e:
                self.show_message("error", str(e))
                continue
            recovered += 1
            self.show_message("info", f"{done.describe()} into {done.folder}")
        return recovered

    def ask_recover(self, journal) -> str:
        """Ask about one unfinished session: "recover", "discard" or "later"."""
        box = QMessageBox(QMessageBox.Question, "An unfinished session was found",
                          f"DuplexCadence stopped during {journal.describe()}. Recover it?", parent=self)
        box.setInformativeText("Recover finishes its logs and recordings from the journal and exports them.")
        rec = box.addButton("Recover…", QMessageBox.AcceptRole)
        discard = box.addButton("Discard", QMessageBox.DestructiveRole)
        box.addButton("Later", QMessageBox.RejectRole)
        box.setDefaultButton(rec)
        box.exec()
        return {rec: "recover", discard: "discard"}.get(box.clickedButton(), "later")
