"""Admission by measured headroom: a new session is refused when admitting it would make a second miss.

The host keeps, for every finished second of every session, when its work ran (host wall clock)
and how late it finished relative to its frame's arrival. Over the trailing window:

* ``busy``: per second of audio, how long *some* session's second was running (the union of the
  intervals over the window, divided by the seconds each session ran; with one launching thread
  this is the sum of the sessions' work per second);
* ``worst``: the longest arrival-to-done time of any second (queue wait + work);
* the cost of one more session: ``busy / n`` per second, ``n`` the sessions that ran seconds in the
  window (the measured mean of a talking session; idle ones cost nothing yet).

Seconds that the host itself stalled or slowed (a departure's teardown holds every session at the gate; an
admission's build and graph captures run beside the sessions' seconds and compete with them for the host and
the GPU: :meth:`LoadMeter.pause`) are left out, with the seconds that then waited in their session's queue
behind them: they say nothing about the sessions' own load.

Admitting adds that cost to both: the new session's second can come due just before anyone's.
Admission is allowed when, after it, ``busy`` and ``worst`` both stay under the deadline less a
reserve (``reserve_ms``, default 100 ms of the 1,000 ms), and the GPU has memory for one more
session at the size the last admission measured. Right after an admission the window holds too
few seconds with every session running: the host says it is still measuring and refuses until
``min_seconds`` seconds per session have been seen, or ``min_seconds + 1.5`` wall seconds have
passed (sessions that send no frames produce no seconds; then it decides on what it saw).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Deque, Iterator, List, Optional, Tuple

from engine.session.records import DEADLINE_MS


class HostFull(RuntimeError):
    """The host refuses a new session; ``str(e)`` is one line saying why."""


@dataclass
class Headroom:
    """What the trailing window measured, and what one more session would do to it."""

    sessions: int
    seconds: int                 # seconds finished in the window with every current session admitted
    busy_ms: float               # per wall second: union of the time some second was running
    worst_ms: float              # longest arrival-to-done of any second in the window
    cost_ms: float               # one more session, per second (busy / sessions)
    budget_ms: float             # deadline less the reserve

    @property
    def free_ms(self) -> float:
        """How much of the budget is still free per second (negative: already over)."""
        return self.budget_ms - max(self.busy_ms, self.worst_ms)

    def admits_one_more(self) -> bool:
        return max(self.busy_ms, self.worst_ms) + self.cost_ms <= self.budget_ms


def union_ms(spans: List[Tuple[float, float]]) -> float:
    """Total length (ms) of the union of ``(start, end)`` intervals in seconds."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total * 1000.0


class LoadMeter:
    """Finished seconds of every session over a trailing window of wall time (thread-safe)."""

    def __init__(self, window_s: float = 10.0, reserve_ms: float = 100.0, min_seconds: int = 3,
                 deadline_ms: float = DEADLINE_MS):
        self.window_s = float(window_s)
        self.reserve_ms = float(reserve_ms)
        self.min_seconds = int(min_seconds)
        self.deadline_ms = float(deadline_ms)
        self._lock = threading.Lock()
        self._spans: Deque[Tuple[float, float, float, int]] = deque()   # (start, end, arrival-to-done ms, session)
        self._since = time.perf_counter()                          # the last change in the session count
        self._pauses: Deque[List[float]] = deque()                 # [start, end]: the host stalled every session

    def record(self, start: float, end: float, latency_ms: float, session: int = -1) -> None:
        """One finished second of ``session``: its work ran from ``start`` to ``end`` (perf_counter s)."""
        with self._lock:
            self._spans.append((start, end, float(latency_ms), int(session)))
            self._trim(end)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Around work the host does for its own sake that stalls or slows every session (an admission's build
        and graph captures, a departure's teardown): seconds whose arrival-to-done overlaps it say nothing about
        the load the sessions make, and are left out of the headroom."""
        entry = [time.perf_counter(), float("inf")]             # open while it lasts: counts for a query meanwhile
        with self._lock:
            self._pauses.append(entry)
        try:
            yield
        finally:
            with self._lock:
                entry[1] = time.perf_counter()

    def _left_out(self, spans: List[Tuple[float, float, float, int]]) -> List[bool]:
        """Per span (in the order given): left out of the headroom? A second whose arrival-to-done overlaps a
        pause is; so is a later second of the same session that arrived before a left-out one finished: it
        waited in that session's queue behind the stall (on the H200 a MiniCPM-o replica refused a fourth
        session at "the slowest second took 2,761 ms": the backlog a build left, drained after it ended)."""
        stalled_until: dict = {}
        out = []
        for start, end, latency_ms, sid in spans:
            arrival = end - latency_ms / 1000.0
            left = (any(arrival <= b and end >= a for a, b in self._pauses)
                    or arrival < stalled_until.get(sid, float("-inf")))
            if left:
                stalled_until[sid] = max(end, stalled_until.get(sid, float("-inf")))
            out.append(left)
        return out

    def sessions_changed(self) -> None:
        """An admission or a departure: measurements before it no longer describe the host."""
        with self._lock:
            self._since = time.perf_counter()

    def _trim(self, now: float) -> None:
        while self._spans and self._spans[0][1] < now - self.window_s:
            self._spans.popleft()
        while self._pauses and self._pauses[0][1] < now - 2 * self.window_s:
            self._pauses.popleft()

    def headroom(self, sessions: int, now: Optional[float] = None) -> Headroom:
        now = time.perf_counter() if now is None else now
        with self._lock:
            self._trim(now)
            every = list(self._spans)
            spans = [s for s, left in zip(every, self._left_out(every)) if not left and s[0] >= self._since]
        budget = self.deadline_ms - self.reserve_ms
        if not spans:
            return Headroom(sessions, 0, 0.0, 0.0, 0.0, budget)
        # per second of audio: paced sessions give one second a wall second (idle ones none), seconds run
        # back to back (a backlog, a benchmark) are charged their real work, not the wall
        active = len({sid for *_, sid in spans})
        audio_seconds = max(1.0, len(spans) / max(1, active), spans[-1][1] - spans[0][0])
        busy = union_ms([(a, b) for a, b, _, _ in spans]) / audio_seconds
        worst = max(lat for _, _, lat, _ in spans)
        cost = busy / max(1, active)                 # what one more *talking* session adds
        return Headroom(sessions, len(spans), busy, worst, cost, budget)

    def measuring_for(self) -> float:
        """Wall seconds since the session count last changed."""
        with self._lock:
            return time.perf_counter() - self._since

    def refusal(self, sessions: int, need_seconds: int) -> Optional[str]:
        """None when one more session fits; else the reason, one line."""
        if sessions == 0:
            return None
        h = self.headroom(sessions)
        # sessions that send nothing produce no seconds: after a few wall seconds decide on what was seen
        if h.seconds < need_seconds and self.measuring_for() < self.min_seconds + 1.5:
            return (f"still measuring the last change ({h.seconds} of {need_seconds} seconds seen with "
                    f"{sessions} session(s)); try again in a few seconds")
        if h.admits_one_more():
            return None
        return (f"no headroom for another session: {sessions} session(s) keep the host busy "
                f"{h.busy_ms:.0f} ms per second, the slowest second took {h.worst_ms:.0f} ms from arrival to "
                f"done, and one more adds about {h.cost_ms:.0f} ms (budget {h.budget_ms:.0f} ms of the "
                f"{self.deadline_ms:.0f} ms deadline)")


def memory_refusal(free_bytes: int, per_session_bytes: int, margin_bytes: int = 256 << 20,
                   horizon_s: Optional[float] = None) -> Optional[str]:
    """None when the device has room for one more session of ``per_session_bytes``; else the reason. With
    ``horizon_s``, ``free_bytes`` is what stays free once every admitted session has grown to that horizon, and
    ``per_session_bytes`` what the new one takes there."""
    if per_session_bytes <= 0 or free_bytes >= per_session_bytes + margin_bytes:
        return None
    over = "" if horizon_s is None else f" for {horizon_s / 60:g} minutes"
    left = "free" if horizon_s is None else "free once the admitted sessions have grown that long"
    return (f"not enough GPU memory for another session{over}: {max(0, free_bytes) / 2**20:.0f} MiB {left}, a "
            f"session takes about {per_session_bytes / 2**20:.0f} MiB (+{margin_bytes / 2**20:.0f} MiB margin)")
