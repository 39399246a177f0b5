"""The capacity bench's steps: hold each asked session count for a window, then bisect the knee.

:func:`step_through` goes up the counts asked (``--counts``), adding the new sessions while the others run (each
joins at its own random moment and is built in the scheduler's slack), lets any backlog the builds left drain,
and measures a window of ``--seconds`` at each count. At the first count with a late second it stops going up;
the knee between the largest clean count and that one is then bisected by *pausing* sessions (kept built, fed
no frames) and feeding them again, each try measured over the same window: the bisection builds nothing. Every window also says what the scheduler did in it (batches and their
sizes, turns, graph launches) and how busy the GPU was (:class:`GpuBusy`).
"""
from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from engine.bench.report import say
from engine.core import graphs
from engine.host.drive import PacedLoad, Window
from engine.session import SessionConfig


def grow_to(load: PacedLoad, cfg: SessionConfig, inputs, n: int) -> None:
    """``n`` sessions fed: the most recent ones paused (kept built), paused ones fed again first, then new ones
    added (each built while the others run, then fed from a random moment)."""
    while len(load.sessions) > n:
        load.pause_last()
    while len(load.sessions) < n and load.resume():
        pass
    while len(load.sessions) < n:
        load.add(cfg, inputs[len(load.sessions) + load.paused])


def _line(label: str, n: int, w: Window, seconds: float) -> str:
    return (f"{label}: {n} session(s), {seconds:g} s: mean {w.mean_ms:.0f} / p99 {w.p99_ms:.0f} / max "
            f"{w.max_ms:.0f} ms, {w.misses} late of {w.seconds}")


class GpuBusy:
    """How busy the GPU was over a window: ``nvidia-smi``'s utilization (the share of time some kernel ran),
    sampled every half second by a thread of its own; None where there is no ``nvidia-smi``."""

    def __init__(self):
        self.samples: List[float] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "GpuBusy":
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._sample, name="gpu-busy", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                      "-i", "0"], capture_output=True, text=True, timeout=5).stdout
                self.samples.append(float(out.strip().splitlines()[0]))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return

    @property
    def percent(self) -> Optional[float]:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


def measure(load: PacedLoad, seconds: float, progress=None) -> Dict[str, object]:
    """One window at the count running now: the window's latencies, what the scheduler did meanwhile, the GPU's
    busy share, and the memory per session."""
    sched = load.host.scheduler
    before, launched = sched.stats.snapshot(), graphs.launches()[1]
    with GpuBusy() as busy:
        w = load.measure(seconds, progress)
    did = sched.stats.since_snapshot(before)
    ticks = max(1, did["ticks"])
    out = w.to_dict()
    out.update(scheduler=did, gpu_busy_percent=busy.percent,
               graph_launches_per_tick=round((graphs.launches()[1] - launched) / ticks, 2),
               memory=load.host.memory_summary())
    return out


def step_through(load: PacedLoad, cfg: SessionConfig, inputs, label: str, counts: Sequence[int], seconds: float,
                 bisect: int, report: Callable[[str, object], None] = lambda key, value: None):
    """(knee, steps): each count in ``counts`` held for ``seconds`` until one has a late second, then up to
    ``bisect`` more windows between the largest clean count and it (sessions paused and resumed, none built)."""
    steps: Dict[int, Dict[str, object]] = {}
    clean, late = 0, None
    for n in sorted(set(int(c) for c in counts)):
        late_n = _hold(load, cfg, inputs, label, n, seconds, steps, report)
        if late_n:
            late = n
            break
        clean = n
    while late is not None and bisect > 0 and late - clean > 1:
        n = (clean + late) // 2
        bisect -= 1
        if _hold(load, cfg, inputs, label, n, seconds, steps, report):
            late = n
        else:
            clean = n
    return clean, steps


def _hold(load, cfg, inputs, label, n, seconds, steps, report) -> bool:
    """Count ``n`` held for a window; whether a second was late."""
    t0 = time.perf_counter()
    grow_to(load, cfg, inputs, n)
    built_s = time.perf_counter() - t0
    load.settle(30.0)
    w = measure(load, seconds)
    w.update(sessions_added_s=round(built_s, 1), window_s=seconds)
    steps[n] = w
    say(_line(label, n, Window(**{k: w[k] for k in ("sessions", "seconds", "misses", "p50_ms", "p99_ms", "max_ms",
                                                     "per_session", "mean_ms")}), seconds)
        + f", GPU busy {w['gpu_busy_percent']}%, batches {w['scheduler']['batches']}")
    report("steps", [steps[k] for k in sorted(steps)])
    return w["misses"] > 0
