"""How the app's sessions live and end: where journals go, threads that die, and Unix signals.

* ``sessions_root()`` — the folder of session journals: ``$DUPLEXCADENCE_SESSIONS`` or
  ``<AppDataLocation>/sessions`` (``~/.local/share/DuplexCadence/sessions`` on Linux). Each
  session journals into its own subfolder; the newest ``KEEP_FINISHED`` finished ones are kept
  (so a stopped session can still be exported), older finished ones are removed when a new
  session starts; unfinished ones are left for the window to offer to recover.
* ``install_thread_guard()`` — an uncaught exception in any Python thread (an audio thread, the
  pump, the engine) or one PortAudio reports from its callback becomes one line in
  ``THREAD_FAILURES``; the session controller stops the session with it. No traceback is printed.
* :class:`SignalBridge` — SIGINT and SIGTERM become a Qt signal on the GUI thread (through
  ``signal.set_wakeup_fd`` and a socket notifier, so they are seen even while Qt's event loop
  sleeps in C++).
"""
from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Deque, Dict, Optional

from PySide6.QtCore import QObject, QSocketNotifier, QStandardPaths, Signal

from engine.session import ExportError
from engine.session.journal import MARKER, SessionJournal, fresh_folder

KEEP_FINISHED = 5
#: one line per thread that died since the session started (read by the controller's timer)
THREAD_FAILURES: Deque[str] = collections.deque(maxlen=100)


def sessions_root() -> Path:
    """Where the app keeps session journals."""
    env = os.environ.get("DUPLEXCADENCE_SESSIONS")
    if env:
        return Path(env).expanduser()
    base = QStandardPaths.writableLocation(QStandardPaths.AppDataLocation)
    return Path(base or Path.home() / ".local" / "share" / "DuplexCadence") / "sessions"


def prune_finished(root: Path, keep: int = KEEP_FINISHED) -> None:
    """Remove all but the newest ``keep`` finished journals under ``root`` (never unfinished ones)."""
    try:
        done = [d for d in root.iterdir() if d.is_dir() and not (d / MARKER).exists()
                and (d / "session.jsonl").exists()]
    except OSError:
        return
    done.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for d in done[keep:]:
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
