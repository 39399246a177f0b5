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

import logging
import threading
from typing import TYPE_CHECKING, List, Optional, Tuple

import numpy as np

from engine.core.toggles import Toggles
from engine.session import LiveError, LiveResult
from engine.session.live import FrameInbox
from engine.session.records import keep_up_notice

from .session import HostedSession

if TYPE_CHECKING:
    from .host import EngineHost

log = logging.getLogger("engine.host")
Item = Tuple[np.ndarray, float, int]        # (frame, arrival perf_counter, frames still waiting)


class HostedRunner(FrameInbox):
    """One hosted session's frames in, results out; its seconds are launched as the host says."""

    def __init__(self, host: "EngineHost", hosted: HostedSession):
        super().__init__()
        self.host = host
        self.hosted = hosted
        self.cfg = hosted.cfg
        self.thread_name = f"hosted-session-{hosted.id}"
        self.done = threading.Event()             # set once the runner has stopped for good
        self._finish_lock = threading.Lock()
        self._finishing = False

    @property
    def session(self) -> Optional[HostedSession]:
        """The hosted session once built (``.info``, ``.records``, ``.summary()``)."""
        return self.hosted if self.hosted.session is not None else None

    # -- caller side (never blocks on the engine; start/submit/backlog/running: FrameInbox) --------
    def _poke(self) -> None:
        self.host.dispatcher_poke()

    def set_toggles(self, toggles: Toggles) -> None:
        """Applied at the next second boundary (that second runs exclusively)."""
        self.hosted.set_toggles(toggles)

    def asked_toggles(self) -> Toggles:
        return self.hosted.asked_toggles()

    def stop(self, timeout: float = 5.0, drain: bool = False) -> None:
        """Finish the second in progress (with ``drain``: every queued second), then leave the host."""
        self._request_stop(drain)
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
        # with a copy of what the tail produced this second (before levelling or queueing): sent later
        self.results.put(LiveResult(rec, audio, not notice, notice, self.hosted.session.last_speech.copy()))
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
