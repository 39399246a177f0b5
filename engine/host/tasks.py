"""A session's second or build as a greenlet on the scheduler's thread, and the port it talks to the scheduler by.

Every session's second (and its build) runs the same code as a session alone, inside a greenlet of its own on the
device's one scheduler thread (:mod:`engine.host.scheduler`). Where that code reaches a yield point
(:mod:`engine.core.yieldpoints`) it *parks*: it switches back to the scheduler with what it waits for, and the
scheduler switches into it again once that is there:

* ``batch``: a batched step (its backbone's entry declares it, ``BackboneEntry.batched_steps``, and the backbone
  makes its runner, :meth:`engine.backbones.base.Backbone.batch_runner`);
  resumed with this member's result once the step ran for every member parked at it;
* ``wait``: the session's stream has work the host is about to read; resumed once an event recorded after that
  work has completed (the scheduler polls it and launches the other sessions' work meanwhile);
* ``slice``: a build between two captures; resumed when no second is ready to run.

What the thread keeps for whoever runs on it is switched with the greenlet: the session's random state goes on
the default generators (:meth:`~engine.host.rng.SessionRng.enter`), its CUDA stream becomes the current one, and
back when it parks. Autograd is off on the scheduler's thread for good (every no_grad block then restores "off").
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import greenlet
import torch

from engine.core import graphs, yieldpoints

if TYPE_CHECKING:
    from .scheduler import Scheduler

READY, BATCH, WAIT, SLICE, DONE, FAILED = "ready", "batch", "wait", "slice", "done", "failed"


class Task(yieldpoints.Port):
    """One greenlet: ``body()`` run for ``owner`` (a hosted session: its ``rng`` and ``stream``) as a ``what``
    ("second", "build" or "ahead"); ``on_done(task)`` once it ended (its ``state`` DONE or FAILED, ``value``)."""

    def __init__(self, sched: "Scheduler", owner, body: Callable[[], Any], what: str, deadline: float,
                 on_done: Callable[["Task"], None]):
        self.sched = sched
        self.owner = owner
        self.on_done = on_done
        self.what = what
        self.deadline = float(deadline)            # perf_counter seconds: earliest first
        self.state = READY
        self.value: Any = None                     # the body's return value (DONE) or its exception (FAILED)
        self.parked_at = 0.0
        self.kind: Optional[str] = None            # BATCH: the step kind; and its group, payload
        self.last_kind: Optional[str] = None       # the kind of its last batched step (it will likely park there again)
        self.group: object = None
        self.member: object = None
        self.payload: Any = None
        self.ready_event: Optional["torch.cuda.Event"] = None     # recorded on the task's stream when it parked
        self._resume_with: Any = None
        self._throw: Optional[BaseException] = None
        self._stream = owner.stream                # the task's current stream (None on the CPU)
        self._body = body
        self._glet = greenlet.greenlet(self._main, parent=greenlet.getcurrent())
        self.started = 0.0
        self.switches = 0
        self.waited_s = 0.0                        # time parked for host reads (the device's work it waited for)

    # -- inside the greenlet ------------------------------------------------------------------------
    def _main(self) -> Any:
        with yieldpoints.bound(self), graphs.working_for(self.owner.rng), torch.no_grad():
            return self._body()

    def _park(self, state: str) -> Any:
        self.state = state
        self.parked_at = time.perf_counter()
        if state in (WAIT, BATCH) and self._stream is not None:
            ev = self.ready_event = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.sched.device))
        got = self._glet.parent.switch()
        if isinstance(got, _Raise):
            raise got.error
        return got

    def batched(self, kind: str, group: object, member: object, payload: Any) -> Any:
        if kind not in self.owner.batched_steps or not self.sched.batches(kind, group):
            raise yieldpoints.NotBatched(kind)
        self.kind, self.group, self.member, self.payload = kind, group, member, payload
        self.last_kind = kind
        try:
            return self._park(BATCH)
        finally:
            self.kind = self.group = self.member = self.payload = None

    def prepare(self, kind: str, group: object, member: object) -> None:
        if kind in self.owner.batched_steps and self.sched.batches(kind, group):
            self.sched.runner(kind, group, member).prepare(member)

    def wait(self) -> None:
        if self._stream is not None:
            self._park(WAIT)

    def slice_point(self) -> None:
        self._park(SLICE)

    # -- on the scheduler's side ------------------------------------------------------------------------
    def resume(self, value: Any = None) -> None:
        """Switch into the greenlet until it parks or ends (its state says which)."""
        first = not self.started
        now = time.perf_counter()
        if first:
            self.started = now
        elif self.state == WAIT:
            self.waited_s += now - self.parked_at
        self.state = READY
        self.ready_event = None
        rng, dev = self.owner.rng, self.sched.device
        rng.enter()
        if self._stream is not None:
            torch.cuda.set_stream(self._stream)
        self.switches += 1
        try:
            out = self._glet.switch() if first else self._glet.switch(value)
        except BaseException as e:  # noqa: BLE001 - the body failed: the session fails alone
            self.state, self.value = FAILED, e
        else:
            if self._glet.dead:
                self.state, self.value = DONE, out
        finally:
            if self._stream is not None:
                self._stream = torch.cuda.current_stream(dev)
                torch.cuda.set_stream(self.sched.stream)
            rng.leave()

    def fail(self, error: BaseException) -> None:
        """Raise ``error`` inside the parked greenlet (its batch failed, or the session is closing)."""
        self.resume(_Raise(error))

    def event_done(self) -> bool:
        """WAIT: whether the work it waits for has completed (polled, never blocks)."""
        return self.ready_event is None or self.ready_event.query()

    @property
    def finished(self) -> bool:
        return self.state in (DONE, FAILED)


class _Raise:
    """What the scheduler sends into a parked greenlet to make its yield point raise ``error``."""

    def __init__(self, error: BaseException):
        self.error = error
