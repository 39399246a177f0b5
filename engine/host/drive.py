"""A paced load on a host: sessions fed one frame a second in real time, results collected, windows measured.

What the capacity bench (``duplexcadence-bench capacity``) drives, and what a test can drive too.
Each session gets its own input (frames repeated cyclically) and its own phase: its frame ``k``
arrives at ``t0 + k`` seconds, with ``t0`` staggered across sessions, so the sessions' seconds come
due spread over the second, as independent callers' would. A frame's arrival time travels with it:
a second is timed from its frame's arrival, waits included.
"""
from __future__ import annotations

import hashlib
import heapq
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from engine.session import LiveError, SessionConfig
from engine.session.records import SecondRecord, percentile

from .host import EngineHost
from .runner import HostedRunner

GOLDEN = 0.6180339887


@dataclass
class Driven:
    """One session under load: its runner, its input, what came back."""

    index: int
    runner: HostedRunner
    frames: Sequence[np.ndarray]
    t0: float = 0.0
    next_k: int = 0
    records: List[SecondRecord] = field(default_factory=list)
    audio: List[np.ndarray] = field(default_factory=list)     # the first ``keep_audio`` seconds
    digests: List[str] = field(default_factory=list)          # every second's output, by index (digest)
    error: str = ""

    def latency_ms(self, rec: SecondRecord) -> float:
        return rec.queue_wait_ms + rec.total_ms


@dataclass
class Window:
    """Seconds that came due in ``[start, end)`` (host clock), across every session."""

    sessions: int
    seconds: int                  # seconds that came due (finished or not: an unfinished one is a miss)
    misses: int
    p50_ms: float                 # arrival to done, all seconds of all sessions
    p99_ms: float
    max_ms: float
    per_session: List[Dict[str, object]]
    mean_ms: float = 0.0

    def to_dict(self) -> Dict[str, object]:
        return {"sessions": self.sessions, "seconds": self.seconds, "misses": self.misses, "mean_ms": self.mean_ms,
                "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "max_ms": self.max_ms, "per_session": self.per_session}


def digest(audio: np.ndarray) -> str:
    """A second's output, by its bytes (equal digests: equal samples, short of a 64-bit collision)."""
    return hashlib.blake2b(np.ascontiguousarray(audio, dtype=np.float32).tobytes(), digest_size=8).hexdigest()


class PacedLoad:
    """Adds and removes sessions on ``host`` and feeds each one frame a second; see the module doc."""

    def __init__(self, host: EngineHost, keep_audio: int = 0, align: int = 0, seed: Optional[int] = None):
        """``align``: sessions come in phase-aligned groups of this many, 0: all staggered. ``seed``: each
        session's phase drawn at random from it (sessions joining at random moments); None: spread by the
        golden ratio."""
        self.host = host
        self.align = int(align)
        self._phases = None if seed is None else random.Random(int(seed))
        self.keep_audio = int(keep_audio)
        self.sessions: List[Driven] = []
        self._removed: List[Driven] = []         # stopped sessions: their errors still count in errors()
        self._paused: List[Driven] = []          # built and kept, fed no frames until resumed
        self._held: List[Driven] = []            # built, not yet fed (add(hold=True) until release())
        self._lock = threading.Lock()
        self._heap: List = []
        self._stop = threading.Event()
        self._added = 0
        self.longest_build_s = 0.0              # the longest add() so far: admission and build (a plan's estimate)
        self._feeder = threading.Thread(target=self._feed, name="paced-feeder", daemon=True)
        self._collector = threading.Thread(target=self._collect, name="paced-collector", daemon=True)
        self._feeder.start()
        self._collector.start()

    # -- sessions --------------------------------------------------------------------------------
    def add(self, cfg: SessionConfig, frames: Sequence[np.ndarray], force: bool = True, hold: bool = False) -> Driven:
        """Admit and build a session (blocks until built), then start feeding it at its own phase. ``hold``:
        built but not fed until :meth:`release` (a batch of builds then runs beside the running sessions
        only, not beside each other's first seconds too)."""
        b0 = time.perf_counter()
        runner = self.host.open(cfg, force=force)
        runner.start()
        runner.ready.wait()
        self.longest_build_s = max(self.longest_build_s, time.perf_counter() - b0)
        if runner.session is None:
            err = runner.results.get()
            raise RuntimeError(err.message if isinstance(err, LiveError) else "the session did not start")
        d = Driven(self._added, runner, frames)
        self._added += 1
        self._held.append(d)
        if not hold:
            self.release()
        return d

    @property
    def held(self) -> int:
        """Sessions built and not yet fed."""
        return len(self._held)

    def release(self) -> None:
        """Start feeding every held session, each at its own phase from now."""
        now = time.perf_counter()
        with self._lock:
            for d in self._held:
                slot = d.index // self.align if self.align > 0 else d.index
                phase = (slot * GOLDEN) % 1.0 if self._phases is None else self._phases.random()
                d.t0 = now + 0.05 + phase
                self.sessions.append(d)
                heapq.heappush(self._heap, (d.t0, d.index, d))
            self._held.clear()

    def remove_last(self) -> None:
        """Stop the most recently added session (its slot frees; its records stay)."""
        with self._lock:
            d = self.sessions.pop()
            self._removed.append(d)
        d.runner.stop(timeout=30.0)

    def pause_last(self) -> None:
        """Stop feeding the most recently added session; it stays built (its records and digests too) and a
        later :meth:`resume` feeds it again from its next frame, at a new moment."""
        with self._lock:
            self._paused.append(self.sessions.pop())

    def resume(self) -> bool:
        """Feed the most recently paused session again (from a random moment); False when none is paused."""
        with self._lock:
            if not self._paused:
                return False
            d = self._paused.pop()
            phase = (d.index * GOLDEN) % 1.0 if self._phases is None else self._phases.random()
            d.t0 = time.perf_counter() + 0.05 + phase - d.next_k
            self.sessions.append(d)
            heapq.heappush(self._heap, (d.t0 + d.next_k, d.index, d))
        return True

    @property
    def paused(self) -> int:
        return len(self._paused)

    def close(self) -> None:
        self._stop.set()
        for d in list(self.sessions) + self._held + self._paused:
            d.runner.stop(timeout=30.0)
        self._feeder.join(5.0)
        self._collector.join(5.0)

    # -- threads ---------------------------------------------------------------------------------
    def _feed(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                item = self._heap[0] if self._heap else None
            if item is None:
                time.sleep(0.01)
                continue
            due, _, d = item
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(min(wait, 0.01))
                continue
            with self._lock:
                heapq.heappop(self._heap)
                alive = d in self.sessions
                if alive:
                    d.next_k += 1
                    heapq.heappush(self._heap, (d.t0 + d.next_k, d.index, d))
            if alive:
                d.runner.submit(d.frames[(d.next_k - 1) % len(d.frames)], arrival=due)

    def _collect(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                every = list(self.sessions)
            got = False
            for d in every:
                while not d.runner.results.empty():
                    res = d.runner.results.get()
                    got = True
                    if isinstance(res, LiveError):
                        d.error = res.message
                        continue
                    d.records.append(res.record)
                    d.digests.append(digest(res.audio))
                    if len(d.audio) < self.keep_audio:
                        d.audio.append(res.audio)
            if not got:
                time.sleep(0.01)

    # -- measuring -------------------------------------------------------------------------------
    def settle(self, timeout: float = 5.0) -> bool:
        """Wait until no session has frames queued (a build's stall has drained); False on timeout."""
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            with self._lock:
                every = list(self.sessions)
            if all(d.runner.backlog() == 0 for d in every):
                return True
            time.sleep(0.05)
        return False

    def measure(self, seconds: float, progress=None) -> Window:
        """Run ``seconds`` of wall time and summarize every second whose frame arrived in it."""
        start = time.perf_counter()
        end = start + float(seconds)
        while time.perf_counter() < end:
            time.sleep(min(1.0, max(0.0, end - time.perf_counter())))
            if progress is not None:
                progress(time.perf_counter() - start)
        time.sleep(1.2)                                      # the last frames' seconds finish
        return self.window(start, end)

    def window(self, start: float, end: float) -> Window:
        with self._lock:
            every = list(self.sessions)
        lat, misses, seconds, per = [], 0, 0, []
        for d in every:
            mine = [r for r in list(d.records) if start <= d.t0 + r.index < end]
            due = max(len(mine), sum(1 for k in range(d.next_k) if start <= d.t0 + k < end))
            ms = [d.latency_ms(r) for r in mine]
            lat += ms
            # a second whose frame came in the window and that has not finished by now is late already
            m = sum(1 for r in mine if r.missed) + due - len(mine)
            misses += m
            seconds += due
            per.append({"session": d.index, "seconds": due, "finished": len(mine), "misses": m,
                        "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
                        "p50_work_ms": percentile([r.total_ms for r in mine], 50),
                        "p99_work_ms": percentile([r.total_ms for r in mine], 99),
                        "speaking": sum(1 for r in mine if r.decision == "speak"),
                        # (when its frame came, s after the window's start; arrival to done, ms)
                        "series": [(round(d.t0 + r.index - start, 2), round(x, 1)) for r, x in zip(mine, ms)]})
            if d.error:
                misses += 1
                per[-1]["error"] = d.error
        return Window(len(every), seconds, misses, percentile(lat, 50), percentile(lat, 99),
                      max(lat, default=0.0), per, mean_ms=float(np.mean(lat)) if lat else 0.0)

    def removed(self) -> List[Driven]:
        """The sessions removed or paused so far (their records and digests kept)."""
        with self._lock:
            return list(self._removed) + list(self._paused)

    def errors(self) -> List[str]:
        """Every session's failure so far, the removed sessions' too (a ramp removes a failed one)."""
        with self._lock:
            every = sorted(self._removed + self.sessions, key=lambda d: d.index)
        return [f"session {d.index}: {d.error}" for d in every if d.error]

