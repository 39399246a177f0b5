"""View models: what the window shows, computed without Qt (tested without a display).

:class:`SessionSeries` turns per-second records into plot arrays and a :class:`Summary` (p50/p99
of the last 60 s, misses, current lateness) with green/yellow/red colours; :class:`EventLog` keeps
timestamped events and renders them as text lines or as JSON (the "copy as JSON" button).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import numpy as np

from engine.stats import format_bytes, percentile  # noqa: F401  (one of each for app and engine)

GREEN, YELLOW, RED, GREY = "#2e9d57", "#d9a21b", "#d64541", "#8a8f98"
MIB = 1024 * 1024
#: how many seconds the summary row looks back
SUMMARY_WINDOW_S = 60


def traffic_light(value: float, yellow_at: float, red_at: float) -> str:
    """GREEN below ``yellow_at``, YELLOW below ``red_at``, RED at or above it."""
    if value >= red_at:
        return RED
    return YELLOW if value >= yellow_at else GREEN


@dataclass
class Summary:
    """The summary row: last-60-s percentiles, misses, lateness, memory, and a colour for each."""
    seconds: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    misses: int = 0                 # whole session
    misses_window: int = 0          # last 60 s
    lateness_ms: float = 0.0        # the latest second
    backlog: int = 0
    state_bytes: int = 0
    reserved_bytes: int = 0
    delay_ms: Optional[float] = None    # mic-to-speaker delay of the latest second (None: not measured)
    delay_plays: bool = True            # its answer went to a speaker (else: the delay until it was ready)
    whole: bool = False                 # a replay: every figure is over the whole session, and says so
    colours: Dict[str, str] = field(default_factory=dict)

    def text(self) -> Dict[str, str]:
        """Label texts by key (the keys of ``colours``); "—" for a value with no data yet."""
        none = not self.seconds
        delay = None if none or self.delay_ms is None else f"{self.delay_ms / 1000.0:.2f} s"
        if self.whole and not none:
            return {
                "p50": f"p50 {self.p50_ms:.0f} ms", "p99": f"p99 {self.p99_ms:.0f} ms",
                "misses": f"misses {self.misses} of {self.seconds} s (whole session)",
                "lateness": f"worst late {self.lateness_ms:.0f} ms",
                "backlog": f"backlog at end {self.backlog} s",
                "delay": f"mic→{'speaker' if self.delay_plays else 'answer'} "
                         + (f"{delay} (median)" if delay else "—"),
                "memory": f"state {format_bytes(self.state_bytes)}",
            }
        return {
            "p50": f"p50 {'—' if none else f'{self.p50_ms:.0f} ms'}",
            "p99": f"p99 {'—' if none else f'{self.p99_ms:.0f} ms'}",
            "misses": "misses —" if none else f"misses {self.misses} ({self.misses_window} in 60 s)",
            "lateness": f"late now {'—' if none else f'{self.lateness_ms:.0f} ms'}",
            "backlog": f"backlog {'—' if none else f'{self.backlog} s'}",
            "delay": f"mic→{'speaker' if self.delay_plays else 'answer'} {delay or '—'}",
            "memory": f"state {'—' if none else format_bytes(self.state_bytes)}",
        }


@dataclass
class StageStats:
    """p50/p99 (ms) of each stage and of the whole second, and a histogram of the second's total."""
    seconds: int
    p50: Dict[str, float]               # keys: listen, think, speak, total
    p99: Dict[str, float]
    bins: np.ndarray                    # [K + 1] histogram edges, ms
    counts: np.ndarray                  # [K] seconds per bin

    STAGES = ("listen", "think", "speak", "total")


class SessionSeries:
    """Per-second series for the plots, one point per record, plus the summary row."""

    def __init__(self, deadline_ms: float = 1000.0):
        self.deadline_ms = float(deadline_ms)
        self.rows: List[dict] = []

    def __len__(self) -> int:
        return len(self.rows)

    def clear(self) -> None:
        self.rows.clear()

    def add(self, record) -> dict:
        """Add one SecondRecord (or its ``to_dict()``); returns the stored row."""
        row = record if isinstance(record, dict) else record.to_dict()
        self.deadline_ms = float(row.get("deadline_ms", self.deadline_ms))
        self.rows.append(row)
        return row

    def window(self, seconds: int) -> "SessionSeries":
        """The last ``seconds`` rows (what a scrolling plot shows; its cost stays flat all session)."""
        view = SessionSeries(self.deadline_ms)
        view.rows = self.rows[-seconds:]
        return view

    def column(self, key: str) -> np.ndarray:
        return np.asarray([float(r[key]) for r in self.rows], dtype=np.float64)

    def index(self) -> np.ndarray:
        return self.column("index")

    def stages(self) -> Dict[str, np.ndarray]:
        """listen/think/speak ms per second (the stacked bars); SPEAK is 0 where the record says the
        tail was skipped (a listening second the model leaves silent)."""
        out = {k: self.column(f"{k}_ms") for k in ("listen", "think", "speak")}
        out["speak"][self.tail_skipped()] = 0.0
        return out

    def tail_skipped(self) -> np.ndarray:
        return np.asarray([bool(r.get("tail_skipped", False)) for r in self.rows], dtype=bool)

    def listening(self) -> np.ndarray:
        """Seconds whose decision was to listen (their SPEAK bar is the tail on silence tokens)."""
        return np.asarray([r.get("decision") == "listen" for r in self.rows], dtype=bool)

    def stage_stats(self, bin_ms: float = 50.0) -> StageStats:
        """Per-stage p50/p99 over these rows and a histogram of the total in ``bin_ms`` bins
        (at least up to 1.2 × the deadline, so sessions compare on one axis)."""
        cols = dict(self.stages(), total=self.column("total_ms"))
        p50 = {k: percentile(v, 50) for k, v in cols.items()}
        p99 = {k: percentile(v, 99) for k, v in cols.items()}
        top = max(1.2 * self.deadline_ms, float(cols["total"].max()) if len(self) else 0.0)
        edges = np.arange(0.0, top + bin_ms, bin_ms)
        counts, _ = np.histogram(cols["total"], bins=edges)
        return StageStats(len(self), p50, p99, edges, counts)

    def missed(self) -> np.ndarray:
        return np.asarray([bool(r["missed"]) for r in self.rows], dtype=bool)

    def memory_mib(self) -> Dict[str, np.ndarray]:
        """Arena bytes and allocator reserved bytes, in MiB."""
        return {"state": self.column("state_bytes") / MIB, "reserved": self.column("reserved_bytes") / MIB}

    def summary(self, window_s: int = SUMMARY_WINDOW_S) -> Summary:
        if not self.rows:
            return Summary(colours={k: GREY for k in Summary().text()})
        delay = self.rows[-1].get("mic_to_speaker_ms")
        recent = self.rows[-window_s:]
        totals = [float(r["total_ms"]) for r in recent]
        last = self.rows[-1]
        s = Summary(seconds=len(self.rows), p50_ms=percentile(totals, 50), p99_ms=percentile(totals, 99),
                    misses=sum(1 for r in self.rows if r["missed"]),
                    misses_window=sum(1 for r in recent if r["missed"]),
                    lateness_ms=float(last["late_ms"]), backlog=int(last.get("backlog", 0)),
                    state_bytes=int(last["state_bytes"]), reserved_bytes=int(last["reserved_bytes"]),
                    delay_ms=float(delay) if delay and delay > 0 else None,     # 0 / None / NaN: not measured
                    delay_plays=bool(self.rows[-1].get("answer_plays", True)))
        d = self.deadline_ms
        s.colours = {
            "p50": traffic_light(s.p50_ms, 0.7 * d, d),
            "p99": traffic_light(s.p99_ms, 0.8 * d, d),
            "misses": traffic_light(s.misses_window, 1, 3),
            "lateness": traffic_light(s.lateness_ms, 1e-9, 0.5 * d),
            "backlog": traffic_light(s.backlog, 1, 3),
            "delay": GREY if s.delay_ms is None else traffic_light(s.delay_ms, 2.0 * d, 3.0 * d),
            "memory": GREEN,
        }
        return s

    def whole_summary(self) -> Summary:
        """The summary of a replayed session: every figure over all of its seconds and labelled so; the
        mic→speaker delay is the median of the records that have one."""
        s = self.summary(window_s=max(1, len(self.rows)))
        if not self.rows:
            return s
        delays = [float(r["mic_to_speaker_ms"]) for r in self.rows if float(r.get("mic_to_speaker_ms") or 0) > 0]
        s.delay_ms = percentile(delays, 50) if delays else None
        s.delay_plays = any(r.get("answer_plays", True) for r in self.rows)
        s.lateness_ms = max(float(r["late_ms"]) for r in self.rows)
        s.whole = True
        d = self.deadline_ms
        s.colours["misses"] = traffic_light(s.misses, 1, 3)
        s.colours["lateness"] = traffic_light(s.lateness_ms, 1e-9, 0.5 * d)
        s.colours["delay"] = GREY if s.delay_ms is None else traffic_light(s.delay_ms, 2.0 * d, 3.0 * d)
        return s

    def mode_changes(self) -> List[dict]:
        """Seconds at which the engine toggles or the user's controls in effect changed (for the plots' marks
        and the event log): each with ``label``, what changed ("demand+graphs", "force-listen on", "echo off",
        "interrupt high", "delay 1.5 s")."""
        out, prev = [], None
        for r in self.rows:
            cur = tuple(r.get(k, d) for k, d in MODE_KEYS)
            if prev is not None and cur != prev:
                change = {"index": r["index"], **{k: v for (k, _), v in zip(MODE_KEYS, cur)}}
                change["label"] = _change_label(dict(zip([k for k, _ in MODE_KEYS], prev)), change)
                out.append(change)
            prev = cur
        return out


#: what a mark on the plots follows: the engine toggles, then the user's controls (key, default)
MODE_KEYS = (("demand_sized", True), ("graph_replay", False), ("force_listen", False),
             ("echo_cancellation", False), ("barge_in_sensitivity", ""), ("playback_delay_s", 0.0))


def _change_label(before: dict, after: dict) -> str:
    parts = []
    if (before["demand_sized"], before["graph_replay"]) != (after["demand_sized"], after["graph_replay"]):
        on = [n for n, k in (("demand", "demand_sized"), ("graphs", "graph_replay")) if after[k]]
        parts.append("+".join(on) if on else "stock-like")
    if before["force_listen"] != after["force_listen"]:
        parts.append(f"force-listen {'on' if after['force_listen'] else 'off'}")
    if before["echo_cancellation"] != after["echo_cancellation"]:
        parts.append(f"echo {'on' if after['echo_cancellation'] else 'off'}")
    if before["barge_in_sensitivity"] != after["barge_in_sensitivity"] and before["barge_in_sensitivity"]:
        parts.append(f"interrupt {after['barge_in_sensitivity']}")
    if before["playback_delay_s"] != after["playback_delay_s"] and before["playback_delay_s"]:
        parts.append(f"delay {after['playback_delay_s']:.1f} s")
    return ", ".join(parts) or "mode"


def keep_up_advice(info: Dict[str, object], cuda: bool) -> str:
    """What would actually help this session keep up, from its info (device, size, graphs, faster paths)."""
    device, size = str(info.get("device", "")), str(info.get("size", ""))
    tips = []
    if device.startswith("cpu"):
        tips.append("run on a GPU (this session runs on the CPU" + (", which has no CUDA graphs)" if not cuda
                                                                     else "; a GPU is available here)"))
        if size != "tiny":
            tips.append("choose the tiny size")
    elif size != "tiny":
        tips.append("choose a smaller size")
    if device.startswith("cuda") and not info.get("graph_replay", True):
        tips.append("turn exact-shape graph replay on")
    paths = [str(p) for p in info.get("fast_paths") or []]
    if any("forced" in p or "reference" in p for p in paths):
        tips.append("let the decoders use their self-checked faster paths (no --reference-paths)")
    tips.append("close other programs using the " + ("GPU" if device.startswith("cuda") else "CPU"))
    return "What would help here: " + "; ".join(tips) + "."


@dataclass
class Event:
    """One line of the event log."""
    time: float          # unix seconds
    kind: str            # "session", "toggle", "barge-in", "device", "error", "export", ...
    text: str
    data: Optional[dict] = None

    def line(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time)) + f".{int(self.time * 1000) % 1000:03d}"
        return f"{stamp}  {self.kind:<9} {self.text}"


class EventLog:
    """Bounded list of events, newest last; ``to_json`` is what "Copy as JSON" puts on the clipboard."""

    def __init__(self, limit: int = 2000):
        self.limit = limit
        self.events: List[Event] = []

    def add(self, kind: str, text: str, data: Optional[dict] = None, when: Optional[float] = None) -> Event:
        ev = Event(time.time() if when is None else float(when), kind, text, data)
        self.events.append(ev)
        del self.events[:-self.limit]
        return ev

    def to_json(self) -> str:
        return json.dumps([{k: v for k, v in asdict(e).items() if v is not None} for e in self.events], indent=1)
