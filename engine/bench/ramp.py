"""The capacity bench's ramp: add sessions step by step, measure a window at each count, confirm the knee.

:func:`ramp` steps by what the last window's p99 leaves free, then bisects between the largest clean count and
the smallest that missed; each step is only as big as its builds allow in the time left (:func:`step_that_fits`).
:func:`confirm` holds the knee for the seconds asked, one fewer on a miss; :func:`confirm_seconds` shortens it so
the builds it must make (:func:`builds_for`) fit before the bench's time limit.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Optional

from engine.host.drive import PacedLoad, Window
from engine.session import SessionConfig
from engine.bench.report import say
from engine.session.records import DEADLINE_MS


def set_count(load: PacedLoad, cfg: SessionConfig, inputs, n: int, fresh: bool = False) -> None:
    """``n`` sessions under load; ``fresh``: all of them new (after an overload, the old ones carry a
    backlog of late frames into the next measurement). Two or more new sessions are all built before any of
    them is fed (session 22: 16 Step-Audio2 sessions built one by one beside the first ones' seconds took
    ~400 s of a 440 s limit; a build beside idle sessions takes ~10 s)."""
    if fresh:
        while load.sessions:
            load.remove_last()
    while len(load.sessions) > n:
        load.remove_last()
    try:                                     # several new sessions: built first, then fed together
        hold = n - len(load.sessions) > 1
        while len(load.sessions) + load.held < n:
            load.add(cfg, inputs[len(load.sessions) + load.held], hold=hold)
    finally:
        load.release()


def _window_line(label: str, n: int, w: Window, seconds: float) -> str:
    return (f"{label}: {n} session(s), {seconds:g} s: latency p50 {w.p50_ms:.0f} / p99 {w.p99_ms:.0f} / "
            f"max {w.max_ms:.0f} ms, {w.misses} missed of {w.seconds}")


def ramp(load: PacedLoad, cfg, inputs, label: str, max_n: int, window: float, time_limit: float,
         start: int = 1, report: Callable[[str, object], None] = lambda key, value: None):
    """(knee, points): the largest count with a clean window, stepping then bisecting (from ``start``,
    a count another ramp found clean). ``report("ramp", windows)`` after each window."""
    points: Dict[int, Window] = {}
    clean, missed, n = 0, None, max(1, min(start, max_n))
    t_end = time.perf_counter() + time_limit
    budget = DEADLINE_MS * 0.9
    overloaded = False
    while True:
        set_count(load, cfg, inputs, n, fresh=overloaded)
        load.settle(5.0)
        w = load.measure(window)
        overloaded = w.misses > 0
        points[n] = w
        say(_window_line(label, n, w, window))
        report("ramp", [dict(p.to_dict(), window_s=window) for _, p in sorted(points.items())])
        if w.misses == 0:
            clean = max(clean, n)
        else:
            missed = n if missed is None else min(missed, n)
        if clean >= max_n or (missed is not None and missed <= clean + 1):
            return clean, points
        if time.perf_counter() > t_end:
            say(f"{label}: ramp time limit reached; knee {clean} not bracketed")
            return clean, points
        if missed is None:                                   # step by what the p99 leaves free
            est = int(n * budget / max(w.p99_ms, 1.0))
            want = min(max_n, max(n + 1, min(est, 2 * n)))
        else:
            want = (clean + missed) // 2 if missed - clean > 2 else clean + 1
        running = 0 if overloaded else len(load.sessions)          # after a miss every session is built afresh
        n = step_that_fits(running, want, t_end - time.perf_counter(), load.longest_build_s, window)
        if n <= running < want:
            say(f"{label}: ramp stopped at {clean}: building {want - running} more session(s) "
                f"(~{load.longest_build_s:.0f} s each under load) would run past the ramp's time")
            return clean, points


#: builds under more load take longer than the longest one seen so far (session 21: the step from 8 to 16
#: Step-Audio2 sessions ran past the time limit); a step is planned with this margin
BUILD_MARGIN = 1.5


def step_that_fits(running: int, want: int, left_s: float, build_s: float, window: float) -> int:
    """The ramp's next count: ``want``, or fewer so that the new sessions' builds (``build_s`` each, times
    :data:`BUILD_MARGIN`), the settling and the window fit in the ``left_s`` seconds the ramp has left. A
    smaller count than ``want`` never goes below ``running + 1`` unless even one build does not fit
    (then ``running``: the ramp stops). Counts below ``running`` (bisecting down) need no builds."""
    if want <= running or build_s <= 0:
        return want
    room = left_s - window - 5.0                      # the window and its settling
    fits = int(room // (build_s * BUILD_MARGIN)) if room > 0 else 0
    return running + max(0, min(want - running, fits))


def confirm(load: PacedLoad, cfg, inputs, label: str, knee: int, seconds: float, tries: int,
            report: Callable[[str, object], None] = lambda key, value: None):
    """Run ``knee`` sessions for ``seconds``; one fewer on a miss (up to ``tries`` runs). ``report(
    "confirmation_so_far", ...)`` every 10 s."""
    result: Optional[Window] = None
    fresh = _confirm_afresh(load, knee)
    while knee > 0 and tries > 0:
        set_count(load, cfg, inputs, knee, fresh=fresh)
        fresh = True
        load.settle(10.0)
        say(f"{label}: confirming {knee} session(s) over {seconds:g} s ...")
        result = load.measure(seconds, progress=_ticker(load, label, seconds, knee, report))
        say(_window_line(label, knee, result, seconds))
        if result.misses == 0:
            return knee, result
        knee, tries = knee - 1, tries - 1
    return 0, result


def _ticker(load: PacedLoad, label: str, seconds: float, sessions: int = 0,
            report: Callable[[str, object], None] = lambda key, value: None):
    """Progress every 10 s of a long run: seconds done, late so far, worst latency so far (printed, and
    reported as ``confirmation_so_far``, so a run cut short keeps them)."""
    start, shown = time.perf_counter(), [0]

    def tick(elapsed: float) -> None:
        if elapsed - shown[0] >= 10.0 and elapsed < seconds:
            shown[0] = elapsed
            w = load.window(start, time.perf_counter() - 1.0)
            say(f"{label}:   {elapsed:4.0f} / {seconds:g} s, {w.misses} late so far, worst {w.max_ms:.0f} ms")
            report("confirmation_so_far", {"sessions": sessions, "planned_s": seconds, "ran_s": round(elapsed, 1),
                                           "late": w.misses, "worst_ms": w.max_ms, "p99_ms": w.p99_ms})
    return tick


def confirm_seconds(asked: float, left_s: float, builds: int, build_s: float) -> float:
    """How long the confirmation runs within the ``left_s`` wall seconds left: ``asked``, or shorter (never
    under 5 s) so that its ``builds`` session builds (one after another, ``build_s`` each: the longest the ramp
    saw; a whole MiniCPM-o session takes ~20 s on the H200) and 25 s of closing fit before the time limit."""
    return min(asked, max(5.0, left_s - 25.0 - builds * build_s))


def builds_for(load: PacedLoad, knee: int) -> int:
    """How many sessions the confirmation at ``knee`` must build: all of them when the running ones carry a
    backlog or outnumber the knee (:func:`confirm` starts afresh then), else only those the ramp left missing.
    (Session 21: reserving ``knee`` builds when the ramp's 16 sessions ran on cut a 60 s confirmation to 5 s.)"""
    if _confirm_afresh(load, knee):
        return knee
    return max(0, knee - len(load.sessions))


def _confirm_afresh(load: PacedLoad, knee: int) -> bool:
    return any(d.runner.backlog() for d in load.sessions) or len(load.sessions) > knee
