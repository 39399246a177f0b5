"""The process's one gate: work that may overlap runs *shared*, captures run *capturing*, the rest *exclusive*.

Shared: a CUDA session's second whose every step replays a captured graph (its random draws come from
its own registered generator state, its launches go to its own stream).

Capturing: a CUDA graph capture with its warm-up, and a whole session build (which installs the
session's random state on the process's default generators and captures its graphs). It holds the
gate shared, so other sessions' shared seconds go on beside it, plus the *capture lock*, so at most one
thread in the process captures or builds at a time. That is safe because a capture runs in
``"thread_local"`` mode on a non-blocking side stream (another thread's launches, allocations and
syncs cannot invalidate it), the allocator sends only the capturing stream's allocations to the
graph's pool, and a shared second never draws from the default generators (the one state a capture
registers besides its own session's): so no other thread can move the state being captured ("Offset
increment outside graph capture"). With ``hand_over`` on, a build gives the lock to a session waiting to capture between two of its own
captures (:meth:`Gate.let_waiters_capture`), its own random state taken off the default generators
meanwhile, instead of making that session's second wait for the whole build.

Exclusive, with nothing else in flight anywhere in the process: closing a session, a second whose
toggles change, every eager second (its draws come from the default generators, which the host swaps
per session), and a batched group's capture (it reads and restores other sessions' state).

There is one gate per process (:data:`GATE`): the host's sessions, the executor's captures, the
backbones' captures and the fast-path self-checks all pass through it, so no two of them can race.

Re-entrant per thread: a thread that holds the gate exclusively may enter it again (shared, capturing
or exclusive) for free. A thread that holds it *shared* and asks for it exclusively is *upgraded*: it
gives its shared hold back, waits as a writer, runs exclusively, then takes its shared hold again
before it goes on — so two readers upgrading at once take turns instead of deadlocking. A thread that
holds the capture lock may not ask to go exclusive (it would wait for readers that wait for its lock):
that is a programming error, raised at once. Writers are preferred, so an admission waits for the
seconds in flight and does not starve.

Tracing (for probes): with :attr:`Gate.trace` a list, every wait of over a millisecond for the gate or the capture
lock, every outermost hold of the capture lock and every hand-over is appended to it as (thread name, what, start,
end) in ``time.perf_counter`` seconds: which thread a stalled second waited for, and for how long.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator, List, Optional, Tuple


class Gate:
    """A readers-writer lock with writer preference, re-entrant and upgradable per thread."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._mine = threading.local()          # .shared, .exclusive, .capturing: this thread's depths
        self._capture_lock = threading.RLock()  # at most one capture (or build) in the process
        self.upgrades = 0                        # shared holds that went exclusive (lazy captures)
        # hand-overs (see let_waiters_capture): off until a host turns them on; threads waiting for the lock
        # for a capture (not a build), and how many times a waiter took it
        self.hand_over = False
        self._capture_waiting = 0
        self._capture_taken = 0
        self.handovers = 0
        self.trace: Optional[List[Tuple[str, str, float, float]]] = None    # see the module's "Tracing"

    def _started(self) -> Optional[float]:
        """The time a traced wait or hold starts (None, and no clock read, when the gate is not traced: the
        gate is taken every second of every session)."""
        return time.perf_counter() if self.trace is not None else None

    def _note(self, what: str, t0: Optional[float], always: bool = False) -> None:
        trace = self.trace
        if trace is not None and t0 is not None:
            t1 = time.perf_counter()
            if always or t1 - t0 > 1e-3:
                trace.append((threading.current_thread().name, what, t0, t1))

    def _depths(self):
        m = self._mine
        if not hasattr(m, "shared"):
            m.shared, m.exclusive, m.capturing = 0, 0, 0
        return m

    def holds(self) -> str:
        """``"exclusive"``, ``"capturing"``, ``"shared"`` or ``""``: what this thread holds now."""
        m = self._depths()
        return ("exclusive" if m.exclusive else "capturing" if m.capturing else "shared" if m.shared
                else "")

    # -- the raw lock ------------------------------------------------------------------------------------
    def _take_shared(self) -> None:
        t0 = self._started()
        with self._cv:
            while self._writer or self._writers_waiting:
                self._cv.wait()
            self._readers += 1
        self._note("wait shared", t0)

    def _give_shared(self) -> None:
        with self._cv:
            self._readers -= 1
            if self._readers == 0:
                self._cv.notify_all()

    def _take_exclusive(self) -> None:
        t0 = self._started()
        with self._cv:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cv.wait()
            self._writers_waiting -= 1
            self._writer = True
        self._note("wait exclusive", t0)

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
        if m.capturing:
            raise RuntimeError("the gate: a thread that holds the capture lock cannot go exclusive (it would "
                               "wait for other threads' seconds that wait for its lock); go exclusive first")
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

    @contextlib.contextmanager
    def capturing(self, build: bool = False) -> Iterator[None]:
        """Shared, plus the process's capture lock: one capture or build at a time, beside shared seconds.
        ``build``: a whole session build (it waits for the lock like any other, but is not handed it by
        :meth:`let_waiters_capture`: two builds never interleave)."""
        m = self._depths()
        with self.shared():
            counted = self.hand_over and not m.capturing and not build     # a waiter a build may hand over to
            if counted:
                with self._cv:
                    self._capture_waiting += 1
                    self._cv.notify_all()           # a build waiting to hand the lock over again (AGAIN_S)
            t0 = self._started()
            self._capture_lock.acquire()
            self._note("wait capture lock (build)" if build else "wait capture lock", t0)
            if counted:
                with self._cv:
                    self._capture_waiting -= 1
                    self._capture_taken += 1
                    self._cv.notify_all()
            m.capturing += 1
            held = self._started()
            try:
                yield
            finally:
                m.capturing -= 1
                self._capture_lock.release()
                if not m.capturing:
                    self._note("held capture lock (build)" if build else "held capture lock", held, always=True)

    def capture_depth(self) -> int:
        """How many capturing holds this thread has open (0: it does not hold the capture lock)."""
        return self._depths().capturing

    def waiters_for_capture(self) -> bool:
        """Whether hand-overs are on and another thread waits for the capture lock to capture."""
        return self.hand_over and self._capture_waiting > 0

    #: after a hand-over, how long the build waits for another capture to ask (a waiter's next hold comes right
    #: after its last), and for how long at most it keeps handing the lock over at one offer
    AGAIN_S = 0.002
    OFFER_MOST_S = 0.5

    def let_waiters_capture(self, timeout_s: float = 5.0) -> bool:
        """Between two captures of a long hold (a session build holds the lock for all of its captures, ~14 s
        for a whole MiniCPM-o session on the H200): when another thread waits for the lock to capture (a running
        session whose store grew), give the lock up until that thread has taken it, then take it back at the same
        depth. Without this, that session's second waited for the rest of the build (session 22: THINK and
        LISTEN seconds of 5-12 s, each ending when the build ended). The caller must be at a point where no
        capture and no warm-up of its own is open and its session's random state is not on the default
        generators (:func:`engine.core.graphs.between_captures` sees to both). A waiter that asks again within
        :attr:`AGAIN_S` of taking it back (its next capture), or another waiter, is handed it again, for up to
        :attr:`OFFER_MOST_S` at this offer: a second that needs several captures gets them all here instead of one
        per offer. Returns whether it handed over."""
        m = self._depths()
        if not (m.capturing and self.waiters_for_capture()):
            return False
        depth, t0 = m.capturing, time.perf_counter()
        while True:
            self._hand_over_once(depth, timeout_s)
            self.handovers += 1
            with self._cv:
                again = self._cv.wait_for(lambda: self._capture_waiting > 0, self.AGAIN_S)
            if not again or time.perf_counter() - t0 > self.OFFER_MOST_S:
                break
        self._note("handed the capture lock over", t0, always=True)
        return True

    def _hand_over_once(self, depth: int, timeout_s: float) -> None:
        """Give the lock (held ``depth`` deep) up until a waiter has taken it (or none waits), then take it back."""
        with self._cv:
            taken = self._capture_taken
        for _ in range(depth):
            self._capture_lock.release()
        try:
            with self._cv:
                self._cv.wait_for(lambda: self._capture_taken != taken or not self._capture_waiting, timeout_s)
        finally:
            for _ in range(depth):
                self._capture_lock.acquire()

    def section(self, exclusive: bool):
        """``exclusive()`` or ``shared()``."""
        return self.exclusive() if exclusive else self.shared()


#: the process's one gate
GATE = Gate()
