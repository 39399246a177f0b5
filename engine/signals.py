"""SIGINT and SIGTERM caught for the length of a ``with`` block, the previous handlers restored on exit.

What ``duplexcadence run`` (:class:`engine.cli.feed.StopSignals`: stop at the next second) and
``duplexcadence serve`` (:class:`engine.serve.drain.DrainSignals`: drain, then a second signal stops at once)
share. It imports nothing of the engine (both sides import it without a cycle) and never Qt (the app has its
own bridge, ``app/lifecycle.py``).
"""
from __future__ import annotations

import signal
import threading


class CaughtSignals:
    """SIGINT and SIGTERM: ``signum`` is the first received (0: none), ``event`` is set at the first and
    ``now`` at any later one. A context manager; the previous handlers come back on exit.

    Python installs handlers from the main thread only: entered from another thread it raises
    (``ValueError``), unless ``quiet_off_main_thread`` is True, when it installs none.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    #: entered outside the main thread: True installs no handler, False lets ``signal.signal`` refuse
    quiet_off_main_thread = False

    def __init__(self) -> None:
        self.signum = 0
        self.event = threading.Event()
        self.now = threading.Event()
        self._old: dict = {}

    def __enter__(self):
        if not self.quiet_off_main_thread or threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum: int, frame) -> None:
        if self.event.is_set():
            self.now.set()
        else:
            self.signum = signum
            self.event.set()
