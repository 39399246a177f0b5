"""The process's one gate: work that may overlap runs *shared*, everything else runs *exclusive*.

Shared: a CUDA session's second whose every step replays a captured graph (its random draws come from
its own registered generator state, its launches go to its own stream). Exclusive, with no other
shared or exclusive section in flight anywhere in the process: every CUDA graph capture (the default
CUDA generator's state is registered with a capture, and any other thread's draw from it while the
capture is open fails with "Offset increment outside graph capture"), building or closing a session,
a second whose toggles change, and every eager second (its draws come from the default generators,
which the host swaps per session).

There is one gate per process (:data:`GATE`): the host's sessions, the executor's captures, the
backbones' captures and the fast-path self-checks all pass through it, so no two of them can race.

Re-entrant per thread: a thread that holds the gate exclusively may enter it again (shared or
exclusive) for free. A thread that holds it *shared* and asks for it exclusively (a lazy capture in a
second that began shared) is *upgraded*: it gives its shared hold back, waits as a writer, runs
exclusively, then takes its shared hold again before it goes on — so two readers upgrading at once
take turns instead of deadlocking. Writers are preferred, so an admission waits for the seconds in
flight and does not starve.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator


class Gate:
    """A readers-writer lock with writer preference, re-entrant and upgradable per thread."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._mine = threading.local()          # .shared (depth) and .exclusive (depth) of this thread
        self.upgrades = 0                        # shared holds that went exclusive (lazy captures)

    def _depths(self):
        m = self._mine
        if not hasattr(m, "shared"):
            m.shared, m.exclusive = 0, 0
        return m

    def holds(self) -> str:
        """``"exclusive"``, ``"shared"`` or ``""``: what this thread holds now."""
        m = self._depths()
        return "exclusive" if m.exclusive else "shared" if m.shared else ""

    # -- the raw lock ------------------------------------------------------------------------------------
    def _take_shared(self) -> None:
        with self._cv:
            while self._writer or self._writers_waiting:
                self._cv.wait()
            self._readers += 1

    def _give_shared(self) -> None:
        with self._cv:
            self._readers -= 1
            if self._readers == 0:
                self._cv.notify_all()

    def _take_exclusive(self) -> None:
        with self._cv:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cv.wait()
            self._writers_waiting -= 1
            self._writer = True

    def _give_exclusive(self) -> None:
        with self._cv:
            self._writer = False
            self._cv.notify_all()

    # -- sections -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        m = self._depths()
        if m.exclusive or m.shared:             # already inside: nothing more to take
            m.shared += 1
            try:
                yield
            finally:
                m.shared -= 1
            return
        self._take_shared()
        m.shared = 1
        try:
            yield
        finally:
            m.shared = 0
            self._give_shared()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        m = self._depths()
        if m.exclusive:
            m.exclusive += 1
            try:
                yield
            finally:
                m.exclusive -= 1
            return
        held = m.shared
        if held:                                 # upgrade: give the shared hold back first
            m.shared = 0
            self._give_shared()
            self.upgrades += 1
        self._take_exclusive()
        m.exclusive = 1
        try:
            yield
        finally:
            m.exclusive = 0
            self._give_exclusive()
            if held:
                self._take_shared()
                m.shared = held

    def section(self, exclusive: bool):
        """``exclusive()`` or ``shared()``."""
        return self.exclusive() if exclusive else self.shared()


#: the process's one gate
GATE = Gate()
