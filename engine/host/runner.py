"""Per-session handles with the live runner's interface, and the two ways of launching seconds.

:class:`HostedRunner` is what :meth:`EngineHost.open` returns: ``start`` / ``submit`` / ``results``
/ ``set_toggles`` / ``stop(drain=)`` / ``ready`` / ``backlog`` / ``running`` / ``session``, like
:class:`~engine.session.LiveRunner`. Frames queue without bound and are never dropped; each
result is a :class:`~engine.session.LiveResult` (or a :class:`~engine.session.LiveError`).

Who launches a session's seconds (``EngineHost(launch=...)``):

* ``"threads"``: every session has its own worker thread that runs its seconds as their frames
  come in; sessions whose seconds replay graphs run concurrently, each on its own CUDA stream (the
  GIL is released while a thread waits on the GPU, so one session's waits hide behind another's
  launches).
* ``"one"``: one dispatcher thread for the whole host runs the due seconds one at a time, earliest
  arrival (= earliest deadline) first.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Deque, List, Optional, Tuple

import numpy as np

from engine.session import LiveError, LiveResult
from engine.session.records import keeps_up
from engine.session.session import check_frame

from .session import HostedSession

if TYPE_CHECKING:
    from .host import EngineHost

log = logging.getLogger("engine.host")
Item = Tuple[np.ndarray, float, int]        # (frame, arrival perf_counter, frames still waiting)


def keep_up_notice(records) -> str:
    """"" while the recent seconds fit the cadence, else what is wrong (one line)."""
    if keeps_up(records):
        return ""
    recent = records[-10:]
    mean = sum(r.total_ms for r in recent) / len(recent)
    return (f"cannot keep up: {recent[-1].backlog} second(s) waiting, {mean:.0f} ms of work per second over "
            f"the last {len(recent)} s (deadline {recent[-1].deadline_ms:.0f} ms)")


class HostedRunner:
    """One hosted session's frames in, results out; its seconds are launched as the host says."""

    def __init__(self, host: "EngineHost", hosted: HostedSession):
        self.host = host
        self.hosted = hosted
        self.cfg = hosted.cfg
        self.results: "queue.Queue" = queue.Queue()
        self.ready = threading.Event()            # set once the session is built (or failed)
        self.done = threading.Event()             # set once the runner has stopped for good
        self._frames: Deque[Tuple[np.ndarray, float]] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._drain = False
        self._running = False
        self._thread: Optional[threading.Thread] = None
        self._finish_lock = threading.Lock()
        self._finishing = False

    @property
    def session(self) -> Optional[HostedSession]:
        """The hosted session once built (``.info``, ``.records``, ``.summary()``)."""
        return self.hosted if self.hosted.session is not None else None

    # -- caller side (never blocks on the engine) ---------------------------------------------------
    def start(self) -> None:
        """Build the session in the background (serially with other admissions); returns at once."""
        if self._thread is not None:
            raise RuntimeError("this runner was already started")
        self._running = True
        self._thread = threading.Thread(target=self._run, name=f"hosted-session-{self.hosted.id}", daemon=True)
        self._thread.start()

    def submit(self, frame, arrival: Optional[float] = None) -> None:
        """Queue one second of mono 24 kHz float32 audio; ``arrival``: when it came in (default now)."""
        x = np.array(check_frame(frame), dtype=np.float32, copy=True)
        with self._cv:
            self._frames.append((x, time.perf_counter() if arrival is None else float(arrival)))
            self._cv.notify()
        self.host.dispatcher_poke()

    def set_toggles(self, demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> None:
        """Applied at the next second boundary (that second runs exclusively)."""
        self.hosted.set_toggles(demand_sized=demand_sized, graph_replay=graph_replay)

    def backlog(self) -> int:
        with self._cv:
            return len(self._frames)

    @property
    def running(self) -> bool:
        return self._running

    def stop(self, timeout: float = 5.0, drain: bool = False) -> None:
        """Finish the second in progress (with ``drain``: every queued second), then leave the host."""
        with self._cv:
            self._stop = True
            self._drain = bool(drain)
            self._cv.notify()
        self.host.dispatcher_poke()
        if self._thread is None:                     # never started: nothing runs, free the slot now
            self.ready.set()
            self._finish()
            return
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.done.wait(timeout)

    # -- frames, for whichever thread launches them ------------------------------------------------
    def head_arrival(self) -> Optional[float]:
        """Arrival of the next frame to run, or None (nothing queued, or stopping without drain)."""
        with self._cv:
            if not self.ready.is_set() or not self._frames or (self._stop and not self._drain):
                return None
            return self._frames[0][1]

    def finished(self) -> bool:
        """Stopping, and nothing left that should run."""
        with self._cv:
            return self._stop and not (self._drain and self._frames)

    def take(self) -> Item:
        with self._cv:
            frame, arrival = self._frames.popleft()
            return frame, arrival, len(self._frames)

    def run_item(self, item: Item) -> bool:
        """Run one second and post its result; False (and a LiveError posted) if it failed."""
        frame, arrival, waiting = item
        try:
            audio, rec = self.hosted.process(frame, arrival=arrival, backlog=waiting)
        except Exception as e:  # noqa: BLE001 - the caller gets one message, the host goes on
            log.exception("hosted session %d failed", self.hosted.id)
            self.results.put(LiveError(f"the session stopped: {type(e).__name__}: {e}"))
            return False
        rec.backlog = self.backlog()
        notice = keep_up_notice(self.hosted.records)
        self.results.put(LiveResult(rec, audio, not notice, notice))
        return True

    # -- the runner's own thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.hosted.start()
        except Exception as e:  # noqa: BLE001
            log.exception("hosted session start failed")
            self.results.put(LiveError(f"cannot start the session: {e}"))
            self.ready.set()
            self._finish()
            return
        self.ready.set()
        if self.host.launch == "threads":
            self._loop()
        else:
            self.host.dispatcher_add(self)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._frames and not self._stop:
                    self._cv.wait(0.5)
            if self.finished():
                break
            if not self.run_item(self.take()):
                break
        self._finish()

    def _finish(self) -> None:
        """Leave the host (idempotent): close the session, free its slot."""
        with self._finish_lock:
            if self._finishing:
                return
            self._finishing = True
        self._running = False
        try:
            self.hosted.close()
        finally:
            self.host.release(self)
            self.done.set()


class Dispatcher:
    """The ``"one"`` launch mode: a single thread runs every due second, earliest arrival first."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._runners: List[HostedRunner] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="host-dispatcher", daemon=True)
        self._thread.start()

    def add(self, runner: HostedRunner) -> None:
        with self._cv:
            self._runners.append(runner)
            self._cv.notify()

    def poke(self) -> None:
        with self._cv:
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(5.0)

    def _pick(self) -> Optional[HostedRunner]:
        """The runner whose next frame arrived first; finishes runners that are done."""
        best, when = None, None
        for r in list(self._runners):
            if r.ready.is_set() and r.finished():
                self._runners.remove(r)
                threading.Thread(target=r._finish, daemon=True).start()
                continue
            t = r.head_arrival()
            if t is not None and (when is None or t < when):
                best, when = r, t
        return best

    def _loop(self) -> None:
        while True:
            with self._cv:
                runner = self._pick()
                while runner is None and not self._closed:
                    self._cv.wait(0.05)
                    runner = self._pick()
                if self._closed:
                    return
            if not runner.run_item(runner.take()):
                with self._cv:
                    if runner in self._runners:
                        self._runners.remove(runner)
                runner._finish()
