"""The host's gate: seconds that may overlap run *shared*, everything else runs *exclusive*.

Shared: a CUDA session whose every step replays a captured graph (its random draws come from its
own registered generator state; its launches go to its own stream). Exclusive, with no other
session's work in flight: building a session (graph capture in PyTorch's default "global" mode
forbids other threads' CUDA calls while it captures), a second whose toggles change (a lazy capture
or an arena migration may happen), and every eager second (its draws come from the default
generators, which the host swaps per session). Writers are preferred, so an admission waits for
the seconds in flight and does not starve.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator


class Gate:
    """A readers-writer lock with writer preference (shared = readers, exclusive = one writer)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cv:
            while self._writer or self._writers_waiting:
                self._cv.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cv:
                self._readers -= 1
                if self._readers == 0:
                    self._cv.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cv:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cv.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cv:
                self._writer = False
                self._cv.notify_all()

    def section(self, exclusive: bool):
        """``exclusive()`` or ``shared()``."""
        return self.exclusive() if exclusive else self.shared()
