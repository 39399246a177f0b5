"""Per-second accounting for ``duplexcadence-bench session``: what a speaking and a listening second cost the device.

Next to each mode's wall time the bench reports, per speaking second and per listening second (a second
speaks when its record's ``decision`` is ``"speak"``, the same split as the bench's "mean speaking second /
mean listening second"): the summed duration of the CUDA kernels it ran, the kernels it launched from the
host, the CUDA graphs it launched, and its memory copies — so the distance to the floor (one graph launch,
no host launches, the kernels' own time) is visible.

The profiler inflates wall time, so the main run is never profiled. A few seconds (``--account-seconds N``)
are picked from the main run, spread over its speaking and listening seconds and preferring seconds in which
nothing was captured (steady state); a second, separate run of the same mode (same config, seed and input,
so the same work second for second) replays the session up to the last picked second and wraps only the
picked seconds in :mod:`torch.profiler`. Each entry's ``wall_ms`` is the main, unprofiled run's time of that
second; ``profiled_wall_ms`` is the profiled one's, for comparison only.

Counted from the profiler's events (kineto activity types):

* ``kernel_ms``: sum of the durations of kernel activities (graph nodes included; kernels on concurrent
  streams add up, so this can exceed the wall time); ``kernels``: how many ran;
* ``kernel_launches``: host launch calls (``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``cuLaunchKernel``,
  ``cuLaunchKernelEx``, ``cudaLaunchCooperativeKernel``); kernels inside a replayed graph are not launched
  from the host and are not counted here;
* ``graph_launches``: ``cudaGraphLaunch`` / ``cuGraphLaunch`` calls; ``graph_replays_counted``: the same
  window's delta of :func:`engine.core.graphs.launches` (our runtime's replay counter, no profiler needed),
  and ``graph_replays_main``: that counter's delta in the main run's same second;
* ``memcpy`` / ``memset``: device copy and set activities; ``cpu_ops``: profiled CPU operators;
* ``top_host_sites`` (``--account-sites``: the profiler records Python frames too): which of our functions
  issued the second's top-level CPU operators, [{"site": ``engine/path.py:function``, "ops", "cpu_ms"}]
  (:mod:`engine.bench.host_sites`); the means per speaking / listening second rank the mean tally;
* ``top_kernels``: where the kernel time went, the ``TOP_KERNELS`` kernels with the most summed time (each
  ``{"kernel": name, "n": how many ran, "ms": summed duration}``, the name cut at its argument list), from the
  second's whole tally by name (``kernel_tally``, kept out of bench.json); the means per speaking / listening
  second rank the mean of those whole tallies.

On the CPU there are no CUDA kernels: the CUDA fields are ``None`` (printed "—"), never zeros made up, and
``cpu_ops`` is the count to read.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

import torch

from engine.bench import host_sites
from engine.core import graphs
from engine.stats import table

T = TypeVar("T")

KERNEL_LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                                 "cudaLaunchCooperativeKernel"})
GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
CUDA_FIELDS = ("kernel_ms", "kernels", "kernel_launches", "graph_launches", "memcpy", "memset")
MEAN_FIELDS = ("wall_ms", "kernel_ms", "kernels", "kernel_launches", "graph_launches", "graph_replays_counted",
               "graph_replays_main", "memcpy", "cpu_ops")
DEFAULT_SECONDS = 6
TOP_KERNELS = 12
_VERSION = re.compile(r"_v\d+$")


def note(cuda: bool) -> str:
    """The sentence printed under the accounting table."""
    head = ("per-second accounting: wall ms from the main, unprofiled run; the other columns from a separate "
            "run of the same mode (same seed and input) with only the counted seconds (n) under torch.profiler")
    if cuda:
        return (head + "; kernel ms = summed CUDA kernel durations; launches = host kernel launch calls; "
                "graph launches from the profiler (cudaGraphLaunch) and from engine.core.graphs' replay counter")
    return (head + "; CPU run: no CUDA kernels, so kernel ms, launches and memcpy are not measured (—) and the "
            "profiled CPU op count is given instead")


def _api(name: str) -> str:
    """A CUDA call's name without CUPTI's version suffix (``cudaLaunchKernelExC_v11060`` -> ``cudaLaunchKernelExC``)."""
    return _VERSION.sub("", name)


def _kind(e) -> str:
    """The event's kineto activity: from ``activity_type()`` where torch has it; else (torch 2.11's
    ``_KinetoEvent``) from its device and name: device events are kernels unless named Memcpy / Memset,
    host events are CUDA API calls when named like one (``cuda...`` / ``cu...``), else CPU ops."""
    if hasattr(e, "activity_type"):
        return str(e.activity_type())
    name = e.name()
    if e.device_type() == torch.autograd.DeviceType.CUDA:
        return "gpu_memcpy" if name.startswith("Memcpy") else "gpu_memset" if name.startswith("Memset") else "kernel"
    api = _api(name)
    if api in KERNEL_LAUNCH_CALLS or api in GRAPH_LAUNCH_CALLS or re.match(r"cu[A-Z]|cuda[A-Z]", api):
        return "cuda_runtime"
    return "cpu_op"


def count_events(events: Iterable[object], cuda: bool) -> Dict[str, Optional[float]]:
    """Counts over kineto events (objects with ``activity_type()``, ``name()`` and ``duration_ns()``).
    Without ``cuda`` the CUDA fields are None: the CPU has none to count."""
    c = {"kernel_ns": 0, "kernels": 0, "kernel_launches": 0, "graph_launches": 0, "memcpy": 0, "memset": 0,
         "cpu_ops": 0}
    by_kernel: Dict[str, List[int]] = {}
    for e in events:
        kind, name = _kind(e), e.name()
        if kind == "cpu_op":
            c["cpu_ops"] += 1
        elif kind == "kernel":
            c["kernels"] += 1
            c["kernel_ns"] += int(e.duration_ns())
            tally = by_kernel.setdefault(name, [0, 0])            # raw names: shortened once each, below
            tally[0] += 1
            tally[1] += int(e.duration_ns())
        elif kind == "gpu_memcpy":
            c["memcpy"] += 1
        elif kind == "gpu_memset":
            c["memset"] += 1
        elif kind in ("cuda_runtime", "cuda_driver"):
            api = _api(name)
            c["kernel_launches"] += api in KERNEL_LAUNCH_CALLS
            c["graph_launches"] += api in GRAPH_LAUNCH_CALLS
    out: Dict[str, object] = {"kernel_ms": c.pop("kernel_ns") / 1e6, **c}
    out["kernel_tally"] = by_name({raw: (n, ns / 1e6) for raw, (n, ns) in by_kernel.items()})
    if not cuda:
        out.update({k: None for k in CUDA_FIELDS + ("kernel_tally",)})
    return out


_NOISE = ("void ", "at::native::", "(anonymous namespace)::")


def kernel_name(name: str, width: int = 120) -> str:
    """A kernel's name without its argument list, ``void``, ``at::native::`` and anonymous namespaces
    (``void at::native::k<a>(float*)`` -> ``k<a>``), white space folded, cut to ``width`` characters: the
    elementwise kernels differ only deep in their template arguments."""
    depth, end = 0, len(name)
    for i, ch in enumerate(name):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth <= 0 and i > 0:
            end = i
            break
    short = " ".join(name[:end].split())
    for noise in _NOISE:
        short = short.replace(noise, "")
    return short if len(short) <= width else short[: width - 1] + "…"


Tally = Dict[str, Tuple[float, float]]           # kernel name -> (how many ran, summed ms)


def _add_up(tallies: Iterable[Tally], divide: float = 1.0) -> Tally:
    """The tallies summed by kernel name (each sum divided by ``divide``: a mean over that many seconds)."""
    sums: Dict[str, List[float]] = {}
    for tally in tallies:
        for k, (n, ms) in tally.items():
            acc = sums.setdefault(k, [0, 0.0])
            acc[0] += n
            acc[1] += ms
    return {k: (n / divide, ms / divide) for k, (n, ms) in sums.items()}


def by_name(raw: Dict[str, Tuple[float, float]]) -> Tally:
    """Raw kernel names' (how many, ms) under their shortened names (:func:`kernel_name`), names that shorten
    alike added up; ~100k kernels a second fall under a few hundred raw names, so each is shortened once."""
    return _add_up([{kernel_name(k): v} for k, v in raw.items()])


def mean_tally(tallies: Sequence[Tally]) -> Tally:
    """The mean of several windows' tallies by kernel name (each name's count and ms over all the windows)."""
    return _add_up(tallies, divide=max(1, len(tallies)))


def top_kernels(tally: Tally, most: int = TOP_KERNELS) -> List[Dict[str, object]]:
    """The ``most`` names with the most time: [{"kernel", "n", "ms"}], most first (ties by name)."""
    ranked = sorted(tally.items(), key=lambda kv: (-kv[1][1], kv[0]))[:most]
    return [{"kernel": k, "n": n, "ms": ms} for k, (n, ms) in ranked]


def per_audio_second(counts: Dict[str, object], audio_seconds: float, most: int) -> Dict[str, object]:
    """A decoder bench's kernel numbers per audio second from :func:`profiled`'s CUDA counts: kernels, their
    summed ms, and the ``most`` kernels' ms by name (the decoder tails' benches)."""
    s = float(audio_seconds)
    return {"kernels_per_audio_s": counts["kernels"] / s, "kernel_ms_per_audio_s": counts["kernel_ms"] / s,
            "top_kernels_ms_per_audio_s": {k["kernel"]: round(k["ms"] / s, 3)
                                           for k in top_kernels(counts["kernel_tally"], most)}}


def _events(prof) -> List[object]:
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        raise RuntimeError(f"torch {torch.__version__}: the profiler kept no kineto results to count")
    return list(results.events())


def profiled(fn: Callable[[], T], cuda: bool, sites: bool = False) -> Tuple[T, Dict[str, Optional[float]]]:
    """``fn()`` under torch.profiler (CPU, plus CUDA when ``cuda``); its result and the window's counts,
    including ``graph_replays_counted`` / ``graph_captures_counted`` from :func:`engine.core.graphs.launches`;
    ``sites``: Python frames recorded too, and ``site_tally`` (:func:`.host_sites.tally`) added."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    cap0, rep0 = graphs.launches()
    with profile(activities=activities, with_stack=bool(sites)) as prof:
        out = fn()
        if cuda:
            torch.cuda.synchronize()
    cap1, rep1 = graphs.launches()
    events = _events(prof)
    counts = count_events([e for e in events if not (sites and host_sites.is_python(e.name()))], cuda)
    counts.update(graph_replays_counted=rep1 - rep0, graph_captures_counted=cap1 - cap0)
    if sites:
        counts["site_tally"] = host_sites.tally(prof.events())
    return out, counts


def _spread(indices: Sequence[int], n: int) -> List[int]:
    """``n`` of ``indices`` spread evenly from first to last (all of them when there are no more than ``n``)."""
    if n >= len(indices):
        return list(indices)
    if n <= 0:
        return []
    if n == 1:
        return [indices[len(indices) // 2]]
    return [indices[round(i * (len(indices) - 1) / (n - 1))] for i in range(n)]


def parse_at(text: Optional[str], seconds: int) -> Optional[List[int]]:
    """``--account-at``: "3" or "3,10" -> [3, 10] (sorted, once each), each second within the run's ``seconds``;
    None or "" -> None. A bad list raises ValueError with one line."""
    if text is None or not str(text).strip():
        return None
    try:
        at = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--account-at {text!r}: whole seconds separated by commas, e.g. 3,10") from None
    bad = [k for k in at if not 0 <= k < seconds]
    if bad or not at:
        raise ValueError(f"--account-at {text!r}: each second must lie in 0..{seconds - 1} (--seconds {seconds})")
    return at


def pick_seconds(speaking: Sequence[bool], captures: Sequence[int], n: int) -> List[int]:
    """Up to ``n`` seconds to profile: half speaking, half listening (the other kind fills in where one is
    short), spread over the run; the first second (cold) and seconds in which a graph was captured are
    avoided while others remain."""
    if n < 0:
        raise ValueError(f"--account-seconds must be 0 or more, not {n}")
    steady = [k for k in range(1, len(speaking)) if not captures[k]] or list(range(len(speaking)))
    speak = [k for k in steady if speaking[k]]
    listen = [k for k in steady if not speaking[k]]
    n_speak = min(len(speak), math.ceil(n / 2))
    n_listen = min(len(listen), n - n_speak)
    n_speak = min(len(speak), n - n_listen)
    return sorted(_spread(speak, n_speak) + _spread(listen, n_listen))


def entries(picks: Sequence[int], counted: Dict[int, Dict[str, object]], records: Sequence[object],
            replays_main: Sequence[int]) -> List[Dict[str, object]]:
    """The per-second list: each picked second's counts with the main run's wall time and speaking flag, and
    its ``top_kernels`` (from its whole kernel tally, which stays out of the list)."""
    out = []
    for k in picks:
        c = dict(counted[k])
        profiled_speaking, profiled_wall = c.pop("speaking"), c.pop("profiled_wall_ms")
        tally = c.pop("kernel_tally")
        c["top_kernels"] = None if tally is None else top_kernels(tally)
        if "site_tally" in c:
            c["top_host_sites"] = host_sites.top(c.pop("site_tally"))
        speaking = records[k].decision == "speak"
        e = {"index": k, "speaking": speaking, "wall_ms": records[k].total_ms, "profiled_wall_ms": profiled_wall}
        e.update(c)
        e.update(graph_replays_main=replays_main[k], decision_matches_main=profiled_speaking == speaking)
        out.append(e)
    return out


def _mean(vals: List[Optional[float]]) -> Optional[float]:
    if not vals or any(v is None for v in vals):
        return None
    return sum(vals) / len(vals)


def means(per_second: Sequence[Dict[str, object]], tallies: Sequence[Optional[Tally]],
          site_tallies: Optional[Sequence[Tally]] = None) -> Dict[str, Dict[str, object]]:
    """Means per speaking and per listening second of each field (None: not measured here, or no such second);
    ``top_kernels`` from the mean of the seconds' whole kernel ``tallies`` (one per entry, None on the CPU), so
    a kernel outside one second's top list still counts there; ``top_host_sites`` likewise from
    ``site_tallies`` when the seconds were counted with sites."""
    out = {}
    for kind, flag in (("speaking", True), ("listening", False)):
        rows = [i for i, e in enumerate(per_second) if e["speaking"] is flag]
        kind_tallies = [tallies[i] for i in rows]
        top = (None if not rows or any(t is None for t in kind_tallies)
               else top_kernels(_add_up(kind_tallies, divide=len(rows))))
        out[kind] = {"seconds": len(rows), **{f: _mean([per_second[i][f] for i in rows]) for f in MEAN_FIELDS},
                     "top_kernels": top}
        if site_tallies is not None:
            out[kind]["top_host_sites"] = (host_sites.top(_add_up([site_tallies[i] for i in rows],
                                                                  divide=len(rows))) if rows else None)
    return out


def _top_table(rows: Dict[str, Dict[str, object]], key: str, cells: Callable[[Dict[str, object]], list],
               heads: List[str], last_width: int, wrap: bool) -> str:
    """Per mode and kind, one row per entry of each mean's ``key`` list ('' when no mode has one)."""
    body = [[name, kind, *cells(k)] for name, acc in rows.items() for kind in ("speaking", "listening")
            for k in acc[kind].get(key) or []]
    if not body:
        return ""
    return table(body, ["mode", "second"] + heads, max_widths=[20, None, None, None, last_width], header_width=10,
                 wrap=wrap)


def format_kernels(rows: Dict[str, Dict[str, object]], wrap: bool = True) -> str:
    """Per mode and kind, where a second's kernel time goes: mean ms and count per second, by kernel name
    ('' when no mode has them: a CPU run)."""
    return _top_table(rows, "top_kernels", lambda k: [k["ms"], k["n"], k["kernel"]],
                      ["ms per second", "kernels per second", "kernel (summed over a second)"], 60, wrap)


def format_sites(rows: Dict[str, Dict[str, object]], wrap: bool = True) -> str:
    """Per mode and kind, which of our functions issue a second's host operators: mean operators and CPU ms per
    second by site ('' when no mode counted sites)."""
    return _top_table(rows, "top_host_sites", lambda k: [k["ops"], k["cpu_ms"], k["site"]],
                      ["ops per second", "CPU ms per second", "site (engine/path.py:function)"], 70, wrap)


def account(make_session: Callable[[], object], frames: Sequence[object], picks: Sequence[int],
            cuda: bool, ahead: str = "off", sites: bool = False) -> Dict[int, Dict[str, object]]:
    """A fresh session (``make_session()``, started here) over ``frames`` up to the last picked second, the
    picked seconds under the profiler (``sites``: with Python frames, see :func:`profiled`); {second: counts,
    with ``speaking`` and ``profiled_wall_ms``}."""
    counted: Dict[int, Dict[str, object]] = {}
    if not picks:
        return counted
    wanted = set(picks)
    if cuda:
        torch.cuda.empty_cache()                  # the main run's blocks go back first, as run_mode does
    s = make_session()
    s.start()
    try:
        for k, f in enumerate(frames[: max(picks) + 1]):
            if k not in wanted:
                s.process(f)
            else:
                (_, rec), c = profiled(lambda: s.process(f), cuda, sites)
                counted[k] = {**c, "speaking": rec.decision == "speak", "profiled_wall_ms": rec.total_ms}
            if ahead != "off":                    # as the main run: the next second's graphs, unprofiled
                s.ahead(scope=ahead)
    finally:
        s.close()
    return counted


def summary(picks: Sequence[int], counted: Dict[int, Dict[str, object]], records: Sequence[object],
            replays_main: Sequence[int], cuda: bool) -> Dict[str, object]:
    """A mode's ``accounting`` entry in bench.json."""
    sites = [counted[k]["site_tally"] for k in picks] if picks and "site_tally" in counted[picks[0]] else None
    per_second = entries(picks, counted, records, replays_main)
    return {"counts": "cuda" if cuda else "cpu (CUDA fields None; cpu_ops counted)", "seconds": list(picks),
            "per_second": per_second, **means(per_second, [counted[k]["kernel_tally"] for k in picks], sites)}


def _cell(v: Optional[float], fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def format_table(rows: Dict[str, Dict[str, object]], wrap: bool = True) -> str:
    """Per mode, a speaking and a listening row: wall ms (unprofiled) then the profiled counts' means."""
    heads = ["mode", "second", "n", "wall ms", "kernel ms", "kernel launches", "graph launches",
             "graph replays counted", "memcpy", "CPU ops"]
    body = []
    for name, acc in rows.items():
        for kind in ("speaking", "listening"):
            m = acc[kind]
            body.append([name, kind, m["seconds"], _cell(m["wall_ms"]), _cell(m["kernel_ms"]),
                         _cell(m["kernel_launches"]), _cell(m["graph_launches"]),
                         _cell(m["graph_replays_counted"]), _cell(m["memcpy"]), _cell(m["cpu_ops"], "{:.0f}")])
    return table(body, heads, max_widths=[20] + [None] * 9, header_width=9, wrap=wrap)
