"""One scheduler per device: the only thread that launches its CUDA work, every session's seconds and builds.

Sessions hand the scheduler their second's input (the host's runners, from their own threads) and get their speech
back; the scheduler runs each session's second in a greenlet of its own (:mod:`engine.host.tasks`), each against
its own deadline (its frame's arrival + 1 s). One turn of the loop:

1. **Start** a second for every session with a frame waiting and no second in flight.
2. **Run** every ready greenlet, earliest deadline first, until it parks or ends: a session's code runs as it
   would alone, launching on its own stream, and parks where it reaches a batched step, a host read or (a build)
   the point between two captures.
3. **Batch**: for each batched step kind with members parked at it (one-token LLM forwards over the same
   weights, say), run it once for all of them on the batch stream (a high-priority stream: every member waits for
   it) — after each member's own work, before each member's next — and resume each with its own result. A kind
   runs once no greenlet is ready and either no session that last parked at that kind is still reading its result
   or its first member has waited :attr:`Scheduler.batch_wait_s`: members reading their last token join it, the
   others do not wait long for them.
4. **Poll** the host reads: a member whose stream finished the work it waits for is ready again.
5. **Build** slices (captures of a session joining) run only when no second is ready, so a build never holds a
   running session's second back by more than one slice.

A greenlet that raises ends its own session's second with that error; the others go on. A batched step that fails
sends its members back to their own steps (same bits, only slower) and is not tried again for that group.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import torch

from engine.core.graphs import record_on

from .tasks import BATCH, FAILED, READY, SLICE, WAIT, Task

log = logging.getLogger("engine.host.scheduler")

BATCH_WAIT_S = 0.0015      # how long a parked batch member waits for others still reading their last result
POLL_S = 0.00005           # the loop's nap while every greenlet waits on the device


class SchedulerStats:
    """What the loop did (for the bench and the host's report)."""

    def __init__(self):
        self.ticks = 0
        self.resumes = 0
        self.batches: Dict[str, List[int]] = {}        # kind -> members per batch run
        self.slices = 0
        self.longest_slice_ms = 0.0
        self.busy_s = 0.0                              # loop time spent resuming greenlets and running batches
        self.since = time.perf_counter()

    def to_dict(self) -> Dict[str, object]:
        return self.since_snapshot({"t": self.since, "ticks": 0, "resumes": 0, "slices": 0, "busy_s": 0.0,
                                    "batches": {}})

    def snapshot(self) -> Dict[str, object]:
        """The counts now, for :meth:`since_snapshot`."""
        return {"t": time.perf_counter(), "ticks": self.ticks, "resumes": self.resumes, "slices": self.slices,
                "busy_s": self.busy_s, "batches": {k: len(v) for k, v in self.batches.items()}}

    def since_snapshot(self, snap: Dict[str, object]) -> Dict[str, object]:
        """What the loop did since ``snap``: turns, resumes, build slices, the share of wall time it was busy,
        and per batched step kind its runs and how many members they had."""
        wall = max(1e-9, time.perf_counter() - snap["t"])
        batches = {}
        for k, v in self.batches.items():
            new = v[snap["batches"].get(k, 0):]
            if new:
                batches[k] = {"runs": len(new), "members_mean": round(sum(new) / len(new), 2), "members_max": max(new)}
        return {"ticks": self.ticks - snap["ticks"], "resumes": self.resumes - snap["resumes"],
                "slices": self.slices - snap["slices"], "longest_slice_ms": round(self.longest_slice_ms, 2),
                "host_busy_fraction": round((self.busy_s - snap["busy_s"]) / wall, 4), "batches": batches}


class Scheduler:
    """The loop of one device (see the module docstring). ``batched``: run the batched steps the backbones
    declare (off: every member runs its own steps, through the same loop)."""

    def __init__(self, device: torch.device, batched: bool = True, batch_wait_s: float = BATCH_WAIT_S):
        self.device = torch.device(device)
        self.batched = bool(batched)
        self.batch_wait_s = float(batch_wait_s)
        self.stats = SchedulerStats()
        self.stream: Optional["torch.cuda.Stream"] = None
        self.batch_stream: Optional["torch.cuda.Stream"] = None
        self._cv = threading.Condition()
        self._calls: Deque[Tuple[Callable[[], Any], concurrent.futures.Future]] = deque()
        self._members: List[Any] = []              # hosted sessions the loop starts seconds for
        self._dirty: Dict[Any, None] = {}          # members that may have something to start (poked), in order
        self._tasks: List[Task] = []
        self._runners: Dict[Tuple[str, int], Any] = {}     # (kind, id(group)) -> the batched step's runner
        self._refused: set = set()                 # (kind, id(group)) whose batched step failed once
        self._closed = False
        self.died: Optional[str] = None            # why the loop itself stopped (a bug of ours), if it did
        self._thread = threading.Thread(target=self._loop, name=f"scheduler-{self.device}", daemon=True)
        self._thread.start()

    # -- from any thread -------------------------------------------------------------------------------
    def call(self, fn: Callable[[], Any]) -> "concurrent.futures.Future":
        """Run ``fn()`` on the loop's thread between two turns; its future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if threading.current_thread() is self._thread:
            _settle(fut, fn)
            return fut
        with self._cv:
            if self.died is not None:
                raise RuntimeError(f"the device's scheduler stopped: {self.died}")
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut

    def run(self, fn: Callable[[], Any], timeout: Optional[float] = None) -> Any:
        """``fn()`` on the loop's thread, waited for; its result (or its exception, raised here)."""
        return self.call(fn).result(timeout)

    def poke(self, member=None) -> None:
        """Something changed for the loop: ``member`` may have something to start (a frame came in)."""
        with self._cv:
            if member is not None:
                self._dirty[member] = None
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(10.0)

    def on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    # -- on the loop's thread ------------------------------------------------------------------------------
    def add_member(self, member) -> None:
        self._members.append(member)
        self._dirty[member] = None

    def remove_member(self, member) -> None:
        """``member`` (a runner, or a hosted session) starts nothing more; the batched steps forget it."""
        if member in self._members:
            self._members.remove(member)
        gone = getattr(member, "batch_member", lambda: None)()
        if gone is not None:
            for runner in list(self._runners.values()):
                leave = getattr(runner, "leave", None)
                if leave is not None:
                    leave(gone)

    def spawn(self, owner, body: Callable[[], Any], what: str, deadline: float,
              on_done: Callable[[Task], None]) -> Task:
        """A new greenlet for ``owner`` (made here, on the loop's thread: greenlets never change threads)."""
        owner.make_stream()
        t = Task(self, owner, body, what, deadline, on_done)
        self._tasks.append(t)
        return t

    def batches(self, kind: str, group: object) -> bool:
        """Whether the loop runs ``kind`` batched for members over ``group`` (asked by a member about to park)."""
        return self.batched and (kind, id(group)) not in self._refused

    def runner(self, kind: str, group: object, member: object):
        """The batched step ``kind`` over ``group`` (made by the first member that asks: its backbone's)."""
        key = (kind, id(group))
        if key not in self._runners:
            self._runners[key] = member.batch_runner(kind, group)
        return self._runners[key]

    def _loop(self) -> None:
        try:
            torch.set_grad_enabled(False)           # for good on this thread (see engine.host.tasks)
            if self.device.type == "cuda":
                if self.device.index is not None:
                    torch.cuda.set_device(self.device)
                self.stream = torch.cuda.current_stream(self.device)
                self.batch_stream = torch.cuda.Stream(self.device, priority=-1)
            while True:
                if not self._turn():
                    if self._idle():
                        return
        except BaseException as e:  # noqa: BLE001 - the loop itself broke: everyone waiting hears it
            log.exception("the device's scheduler stopped")
            self._die(f"{type(e).__name__}: {e}")

    def _die(self, why: str) -> None:
        """The loop broke: every pending call raises, every greenlet's owner hears it ended, nothing waits on."""
        with self._cv:
            self.died = why
            calls = list(self._calls)
            self._calls.clear()
        error = RuntimeError(f"the device's scheduler stopped: {why}")
        for _, fut in calls:
            fut.set_exception(error)
        for t in list(self._tasks):
            t.state, t.value = FAILED, error
            self._tasks.remove(t)
            try:
                t.on_done(t)
            except Exception:  # noqa: BLE001 - one owner's trouble does not keep the others waiting
                log.exception("a session could not be told that the scheduler stopped")

    def _turn(self) -> bool:
        """One turn of the loop; whether anything happened."""
        self.stats.ticks += 1
        did = self._run_calls()
        with self._cv:
            dirty, self._dirty = self._dirty, {}
        for m in dirty:
            if m not in self._members:
                continue
            item = m.next_task()                   # (owner, body, what, deadline, on_done) or None
            if item is not None:
                self.spawn(*item)
                did = True
        t0 = time.perf_counter()
        did |= self._run_ready()
        did |= self._run_batches()
        did |= self._poll_waits()
        if not did:
            did = self._run_slice()
        self.stats.busy_s += time.perf_counter() - t0 if did else 0.0
        return did

    def _run_calls(self) -> bool:
        with self._cv:
            calls = list(self._calls)
            self._calls.clear()
        for fn, fut in calls:
            _settle(fut, fn)
        return bool(calls)

    def _run_ready(self) -> bool:
        ready = sorted((t for t in self._tasks if t.state == READY and t.what == "second"), key=lambda t: t.deadline)
        for t in ready:
            self._resume(t)
        return bool(ready)

    def _resume(self, t: Task, value: Any = None, after: Optional["torch.cuda.Event"] = None) -> None:
        if after is not None and t._stream is not None:
            t._stream.wait_event(after)
        t.resume(value)
        self.stats.resumes += 1
        if t.state == SLICE and t.what == "second":      # a capture inside a second: it goes on in the next turn
            t.state = READY
        if t.finished:
            self._tasks.remove(t)
            t.on_done(t)

    def _run_batches(self) -> bool:
        parked = [t for t in self._tasks if t.state == BATCH]
        if not parked or any(t.state == READY and t.what == "second" for t in self._tasks):
            return False
        now = time.perf_counter()
        # sessions reading their last step's result (a sampled token) will likely park at the same kind again
        coming = {t.last_kind for t in self._tasks if t.state == WAIT and t.what == "second"}
        groups: Dict[Tuple[str, int], List[Task]] = {}
        for t in parked:
            groups.setdefault((t.kind, id(t.group)), []).append(t)
        ran = False
        for key, members in sorted(groups.items(), key=lambda kv: min(t.deadline for t in kv[1])):
            if key[0] in coming and now - min(t.parked_at for t in members) < self.batch_wait_s:
                continue
            self._run_batch(key, members)
            ran = True
        return ran

    def _run_batch(self, key: Tuple[str, int], members: List[Task]) -> None:
        kind = key[0]
        try:
            runner = self.runner(kind, members[0].group, members[0].member)
            results, done = self._launch(runner, members)
        except Exception as e:  # noqa: BLE001 - the members run their own steps (same bits)
            log.exception("batched step %s failed; its members step alone from now on", kind)
            self._refused.add(key)
            self._runners.pop(key, None)
            for t in members:
                self._fail_into(t, _not_batched(kind, e))
            return
        self.stats.batches.setdefault(kind, []).append(len(members))
        for t, r in zip(members, results):
            if t._stream is not None:
                record_on(r, t._stream)
            self._resume(t, r, after=done)

    def _launch(self, runner, members: List[Task]):
        """The batched step over ``members``, on the batch stream after each member's own work; (results, the
        event after it, or None on the CPU)."""
        mems, loads = [t.member for t in members], [t.payload for t in members]
        bs = self.batch_stream
        if bs is None:
            return runner.run(mems, loads), None
        for t in members:
            if t.ready_event is not None:
                bs.wait_event(t.ready_event)
        with torch.cuda.stream(bs):
            for p in loads:
                record_on(p, bs)
            results = runner.run(mems, loads)
        done = torch.cuda.Event()
        done.record(bs)
        return results, done

    def _fail_into(self, t: Task, error: BaseException) -> None:
        t.fail(error)
        self.stats.resumes += 1
        if t.finished:
            self._tasks.remove(t)
            t.on_done(t)

    def _poll_waits(self) -> bool:
        """Seconds whose read is ready go on now; a build whose read is ready waits for its next slice."""
        woke = False
        for t in [t for t in self._tasks if t.state == WAIT]:
            if t.event_done():
                if t.what == "second":
                    self._resume(t)
                    woke = True
                else:
                    t.state = SLICE
        return woke

    def _run_slice(self) -> bool:
        """One build slice, the earliest admitted first, when no second has anything to run (none ready, none
        parked at a batched step: only reads of the device's work pending)."""
        if any(t.what == "second" and t.state in (READY, BATCH) for t in self._tasks):
            return False
        # one build at a time, to its end: the next one then finds the weights it shares in the host's cache
        begun = [t for t in self._tasks if t.what != "second" and t.started]
        builds = begun or [t for t in self._tasks if t.what != "second"]
        builds = [t for t in builds if t.state in (READY, SLICE)]
        if not builds:
            return False
        t = min(builds, key=lambda b: b.deadline)
        t0 = time.perf_counter()
        self._resume(t)
        self.stats.slices += 1
        self.stats.longest_slice_ms = max(self.stats.longest_slice_ms, (time.perf_counter() - t0) * 1e3)
        return True

    def _idle(self) -> bool:
        """Nothing to do this turn: nap while the device works, or sleep until called; True once closed."""
        with self._cv:
            if self._closed and not self._calls:
                return True
            if self._calls:
                return False
            busy = any(t.state in (WAIT, BATCH) for t in self._tasks)
            if not busy:
                self._cv.wait(0.05)
                return False
        time.sleep(POLL_S)
        return False


def _settle(fut: "concurrent.futures.Future", fn: Callable[[], Any]) -> None:
    try:
        fut.set_result(fn())
    except BaseException as e:  # noqa: BLE001 - handed to the caller
        fut.set_exception(e)


def _not_batched(kind: str, cause: BaseException) -> BaseException:
    from engine.core.yieldpoints import NotBatched
    err = NotBatched(f"the batched {kind} step failed: {type(cause).__name__}: {cause}")
    err.__cause__ = cause
    return err
