"""The process's capture lock: at most one CUDA graph capture (with its warm-up) open at a time.

Every capture in the process — the executor's graphs, a backbone's layer and decode graphs, a batched step's group
graphs, a fast-path self-check — is taken through :data:`GATE` (:meth:`Gate.capturing`), so two threads can never
capture at once: they share one capture stream (:func:`engine.core.graphs.capture_stream`) and one set of default
generator states, which a capture registers.

Many sessions on one device do not need more than this: the device's scheduler (:mod:`engine.host.scheduler`) is
the only thread that launches their work, and it switches between them only where no capture is open. The lock is
re-entrant, and every greenlet of that thread holds it as the thread does (a capture never spans a switch).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator


class Gate:
    """The capture lock (re-entrant per thread)."""

    def __init__(self) -> None:
        self._capture_lock = threading.RLock()
        self._mine = threading.local()

    def _depth(self) -> int:
        return getattr(self._mine, "capturing", 0)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Hold the capture lock for the block (a capture with its warm-up, or several in a row)."""
        with self._capture_lock:
            self._mine.capturing = self._depth() + 1
            try:
                yield
            finally:
                self._mine.capturing -= 1

    def holds(self) -> str:
        """``"capturing"`` while this thread holds the lock, else ``""``."""
        return "capturing" if self._depth() else ""

    def capture_depth(self) -> int:
        """How many capturing holds this thread has open (0: it does not hold the capture lock)."""
        return self._depth()


#: the process's one capture lock
GATE = Gate()
