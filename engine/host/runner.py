"""Per-session handles with the live runner's interface, whose seconds the device's scheduler runs.

:class:`HostedRunner` is what :meth:`EngineHost.open` returns: ``start`` / ``submit`` / ``results`` /
``set_toggles`` / ``stop(drain=)`` / ``ready`` / ``backlog`` / ``running`` / ``session``, like
:class:`~engine.session.LiveRunner`. Frames queue without bound and are never dropped; each result is a
:class:`~engine.session.LiveResult` (or a :class:`~engine.session.LiveError`). No thread of its own: the caller's
threads submit frames and read results, and the scheduler (:mod:`engine.host.scheduler`) asks the runner, every
turn of its loop, for the next thing to run — the build first, then one second at a time in frame order, and in
the time before the next frame what that frame's second will replay (the session's ``ahead``).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Optional

from engine.core.toggles import Toggles
from engine.session import LiveError, LiveResult
from engine.session.live import FrameInbox
from engine.session.records import keep_up_notice

from .session import HostedSession
from .tasks import DONE

if TYPE_CHECKING:
    from .host import EngineHost
    from .tasks import Task

log = logging.getLogger("engine.host")


class HostedRunner(FrameInbox):
    """One hosted session's frames in, results out; the scheduler runs its build and seconds."""

    def __init__(self, host: "EngineHost", hosted: HostedSession):
        super().__init__()
        self.host = host
        self.hosted = hosted
        self.cfg = hosted.cfg
        self.done = threading.Event()             # set once the runner has stopped for good
        self._busy = False                        # a task of this runner is in flight (loop thread only)
        self._started = False
        self._finished = False
        self._ahead_done = True                   # the last second's ahead ran (or none is due)

    @property
    def session(self) -> Optional[HostedSession]:
        """The hosted session once built (``.info``, ``.records``, ``.summary()``)."""
        return self.hosted if self.hosted.session is not None else None

    # -- caller side (never blocks on the engine) ------------------------------------------------------
    def start(self) -> None:
        """Queue the build on the scheduler; returns at once (``ready`` is set once built or failed)."""
        if self._started:
            raise RuntimeError("this runner was already started")
        self._started = self._running = True
        self._admitted = time.perf_counter()          # builds run in the order their sessions were started
        self.host.scheduler.call(lambda: self.host.scheduler.add_member(self))

    def _poke(self) -> None:
        self.host.scheduler.poke(self)

    def set_toggles(self, toggles: Toggles) -> None:
        """Applied at the next second boundary."""
        self.hosted.set_toggles(toggles)

    def asked_toggles(self) -> Toggles:
        return self.hosted.asked_toggles()

    def stop(self, timeout: float = 5.0, drain: bool = False) -> None:
        """Finish the second in progress (with ``drain``: every queued second), then leave the host."""
        self._request_stop(drain)
        if not self._started:                        # never started: nothing runs, free the slot now
            self.ready.set()
            self._finish()
            return
        if not self.host.scheduler.on_loop():
            self.done.wait(timeout)

    # -- the scheduler's side (its thread) ------------------------------------------------------------
    def next_task(self):
        """What the scheduler should start for this session now, or None: (owner, body, what, deadline, on_done)."""
        if self._busy or self._finished:
            return None
        if not self.ready.is_set():
            self._busy = True
            return self.hosted, self.hosted.build, "build", self._admitted, self._built
        with self._cv:
            stopping = self._stop and not (self._drain and self._frames)
            item = None if stopping or not self._frames else self._frames.popleft()
            waiting = len(self._frames)
        if stopping:
            self._finish()
            return None
        if item is None:
            return self._ahead()
        frame, arrival = item
        self._busy, self._ahead_done = True, False
        body = lambda: self.hosted.second(frame, arrival, waiting)              # noqa: E731
        return self.hosted, body, "second", arrival + 1.0, self._second_done

    def _ahead(self):
        """In the time before the next frame: what its second replays, once per second (a slice-only task)."""
        if self._ahead_done or self.hosted.session is None:
            return None
        self._busy, self._ahead_done = True, True
        body = lambda: self.hosted.ahead(stop=self._frame_waiting)              # noqa: E731
        return self.hosted, body, "ahead", time.perf_counter() + 1.0, self._ahead_finished

    def _frame_waiting(self) -> bool:
        """Whether the next frame (or a stop) is here: what the preparation between seconds stops for."""
        return bool(self._frames) or self._stop

    def batch_member(self):
        return self.hosted.batch_member()

    def _free(self) -> None:
        """This runner's task ended: the scheduler asks it again for the next thing to run."""
        self._busy = False
        self.host.scheduler.poke(self)

    def _built(self, task: "Task") -> None:
        self._free()
        if task.state != DONE:
            e = task.value
            expected = isinstance(e, (ValueError, OSError, ImportError, KeyError))
            log.log(logging.DEBUG if expected else logging.ERROR, "hosted session start failed", exc_info=e)
            self.results.put(LiveError(f"cannot start the session: {e}"))
            self.ready.set()
            self._finish()
            return
        self.ready.set()

    def _second_done(self, task: "Task") -> None:
        self._free()
        if task.state != DONE:
            e = task.value
            log.error("hosted session %d failed", self.hosted.id, exc_info=e)
            self.results.put(LiveError(f"the session stopped: {type(e).__name__}: {e}"))
            self._finish()
            return
        audio, rec = task.value
        rec.backlog = self.backlog()
        notice = keep_up_notice(self.hosted.records)
        # with a copy of what the tail produced this second (before levelling or queueing): sent later
        self.results.put(LiveResult(rec, audio, not notice, notice, self.hosted.session.last_speech.copy()))

    def _ahead_finished(self, task: "Task") -> None:
        self._free()
        if task.state != DONE:
            log.error("hosted session %d: preparing its next second failed", self.hosted.id, exc_info=task.value)

    def _finish(self) -> None:
        """Leave the host (idempotent): close the session, free its slot."""
        if self._finished:
            return
        self._finished = True
        self._running = False
        try:
            if self.host.scheduler.on_loop():
                self.host.scheduler.remove_member(self)
                self.hosted._close()
            else:
                self.hosted.close()
        finally:
            self.host.release(self)
            self.done.set()
