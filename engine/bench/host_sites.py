"""Where a second's host operators come from: each CPU operator called from Python, by our code that called it.

A hosted MiniCPM-o speaking second on the H200 ran ~13,900 profiled CPU operators and ~2,100 host kernel launches
beside its 307 graph launches, all on the one thread that launches the device's work: with many sessions that host
work, beside the GPU's ~111 kernel ms, is what several sessions speaking at once contend for. To cut it one has to
know which of our functions issue it. With ``torch.profiler``'s ``with_stack``, every Python call is an event too,
and each operator's ``cpu_parent`` chain leads up through the Python frames that called it. Here each *top-level*
operator (one called from Python, not from inside another operator) is charged to the innermost frame of ours —
a file under ``engine/`` — on that chain, as ``engine/path.py:function``; operators no frame of ours called (the
profiler's own, torch internals run from elsewhere) go to :data:`OUTSIDE`. Per site: how many operators, and their
CPU time including the operators they dispatch to (``cpu_time_total``).

The tally has the kernel tally's shape (name -> (count, ms)), so a mode's mean per speaking / listening second
adds up the same way (:func:`engine.bench.accounting.means`).
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Tuple

#: a profiler event for a Python frame: ``path(line): function``
PY_FRAME = re.compile(r"^(?P<path>.+)\((?P<line>\d+)\): (?P<func>.+)$")
#: the part of a frame's path that is ours
OURS = re.compile(r"(?:^|[/\\])(engine[/\\][\w/\\.]+?\.py)$")
OUTSIDE = "(not called from engine/)"
TOP_SITES = 15

Tally = Dict[str, Tuple[float, float]]           # site -> (operators, CPU ms)


def is_python(name: str) -> bool:
    """Whether an event stands for Python (a frame, or a built-in method the tracer records) rather than an op."""
    return bool(PY_FRAME.match(name)) or name.startswith("<built-in")


def site(name: str) -> Optional[str]:
    """``engine/path.py:function`` for a frame event of ours; None for any other event."""
    m = PY_FRAME.match(name)
    if m is None:
        return None
    ours = OURS.search(m.group("path"))
    return None if ours is None else f"{ours.group(1).replace(chr(92), '/')}:{m.group('func')}"


def charged_to(event) -> str:
    """The innermost frame of ours above ``event`` on its ``cpu_parent`` chain (:data:`OUTSIDE` if none)."""
    p = event.cpu_parent
    while p is not None:
        s = site(p.name)
        if s is not None:
            return s
        p = p.cpu_parent
    return OUTSIDE


def tally(events: Iterable[object]) -> Tally:
    """Top-level CPU operators of a profiled window (``prof.events()``, recorded ``with_stack``) by site."""
    out: Dict[str, List[float]] = {}
    for e in events:
        if is_python(e.name) or getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            continue
        parent = e.cpu_parent
        if parent is not None and not is_python(parent.name):
            continue                                    # dispatched by another operator: counted in its total
        acc = out.setdefault(charged_to(e), [0, 0.0])
        acc[0] += 1
        acc[1] += float(e.cpu_time_total) / 1e3
    return {k: (n, ms) for k, (n, ms) in out.items()}


def top(t: Tally, most: int = TOP_SITES) -> List[Dict[str, object]]:
    """The ``most`` sites with the most operators: [{"site", "ops", "cpu_ms"}], most first (ties by name)."""
    ranked = sorted(t.items(), key=lambda kv: (-kv[1][0], kv[0]))[:most]
    return [{"site": k, "ops": n, "cpu_ms": round(ms, 3)} for k, (n, ms) in ranked]
