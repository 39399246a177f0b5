"""Export a session's records: CSV, JSON Lines and a Chrome trace (opens in Perfetto).

Every file is written atomically (a temporary file in the same folder, then ``os.replace``): a
reader never sees half a file, and a failed export leaves nothing behind. An unwritable path is one
:class:`ExportError` naming the file and the reason; the records are only read, never changed.

The trace has one complete event (``"ph": "X"``) per stage per second, in microseconds from the
first second's start, on a "stages" track; the whole second, the time its frame waited in the
queue and each missed deadline are on tracks of their own; the audio path's moments (barge-ins, gaps, dropped
speech, replies) on one more; the "toggles and controls" track marks each request (an engine toggle or a user
control, asked during that second) and each second from which what is in effect changed.
:func:`audio_path_summary` (the reply gap and the barge-in latency, p50 and p90) is what the app writes as a
session's ``summary.json``.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Dict, List, Sequence

from engine.atomic import atomic_write

from .records import SecondRecord, percentile

STAGES = (("LISTEN", "listen_ms"), ("THINK", "think_ms"), ("SPEAK", "speak_ms"))
TRACKS = {1: "seconds", 2: "stages", 3: "queue wait", 4: "deadline", 5: "audio path", 6: "toggles and controls"}
#: what a record says was in effect (the engine toggles, then the user's controls): a change is marked
MODES = ("demand_sized", "graph_replay", "force_listen", "echo_cancellation", "barge_in_sensitivity",
         "playback_delay_s")


class ExportError(OSError):
    """A session export that could not be written (the message names the file and the reason)."""


def _atomic_write(path: Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text), ExportError, text=True, sync=True)


def to_csv(records: Sequence[SecondRecord]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=SecondRecord.columns(), lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow(r.to_dict())
    return buf.getvalue()


def to_jsonl(records: Sequence[SecondRecord]) -> str:
    return "".join(json.dumps(r.to_dict(), sort_keys=False) + "\n" for r in records)


def _us(ms: float) -> float:
    return round(ms * 1000.0, 3)


def trace_events(records: Sequence[SecondRecord]) -> List[Dict[str, object]]:
    """Chrome trace events: complete events per stage per second (µs from the first second)."""
    events: List[Dict[str, object]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "duplex session"}}]
    for tid, name in TRACKS.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}})
    t0 = records[0].wall_start if records else 0.0
    prev = None
    for r in records:
        start = (r.wall_start - t0) * 1e6                           # µs
        args = {"index": r.index, "decision": r.decision, "tokens": r.tokens, "missed": r.missed,
                "late_ms": round(r.late_ms, 3), "state_bytes": r.state_bytes, "reserved_bytes": r.reserved_bytes,
                "demand_sized": r.demand_sized, "graph_replay": r.graph_replay}
        events.append({"name": f"second {r.index}", "cat": "second", "ph": "X", "pid": 1, "tid": 1,
                       "ts": round(start, 3), "dur": _us(r.total_ms), "args": args})
        at = start
        for name, field in STAGES:
            dur = getattr(r, field)
            events.append({"name": name, "cat": "stage", "ph": "X", "pid": 1, "tid": 2,
                           "ts": round(at, 3), "dur": _us(dur), "args": {"index": r.index}})
            at += dur * 1000.0
        if r.queue_wait_ms > 0:
            events.append({"name": "queued", "cat": "queue", "ph": "X", "pid": 1, "tid": 3,
                           "ts": round(start - r.queue_wait_ms * 1000.0, 3), "dur": _us(r.queue_wait_ms),
                           "args": {"index": r.index}})
        if r.missed:
            events.append({"name": f"missed by {r.late_ms:.0f} ms", "cat": "deadline", "ph": "i", "s": "t",
                           "pid": 1, "tid": 4, "ts": round(start + r.total_ms * 1000.0, 3),
                           "args": {"index": r.index, "late_ms": round(r.late_ms, 3)}})
        events += _audio_path_events(r, start)
        events += _toggle_events(r, prev, start)
        prev = r
    return events


def _mode_text(name: str, value) -> str:
    if isinstance(value, bool):
        return f"{name} {'on' if value else 'off'}"
    return f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"


def _toggle_events(r: SecondRecord, prev, start_us: float) -> List[Dict[str, object]]:
    """Instant events on the "toggles and controls" track: the requests made during this second, and what
    changed in effect from it (against the second before)."""
    out = []
    if r.requests:
        out.append({"name": f"requested: {r.requests}", "cat": "toggle", "ph": "i", "s": "p", "pid": 1, "tid": 6,
                    "ts": round(start_us, 3), "args": {"index": r.index, "requests": r.requests}})
    changed = {k: getattr(r, k) for k in MODES if prev is not None and getattr(r, k) != getattr(prev, k)}
    if changed:
        text = ", ".join(_mode_text(k, v) for k, v in changed.items())
        out.append({"name": f"in effect: {text}", "cat": "toggle", "ph": "i", "s": "p", "pid": 1, "tid": 6,
                    "ts": round(start_us, 3), "args": {"index": r.index, **changed}})
    return out


def _audio_path_events(r: SecondRecord, start_us: float) -> List[Dict[str, object]]:
    """Instant events on the "audio path" track: this second's barge-ins, playback gaps, dropped speech and the
    reply that began in it."""
    marks = [("barge-in", r.barge_ins, {"latency_ms": round(r.barge_in_latency_ms, 3)}),
             ("playback gap", r.playback_gaps, {"gap_ms": round(r.playback_gap_ms, 3)}),
             ("dropped speech", int(r.dropped_speech_ms > 0), {"dropped_ms": round(r.dropped_speech_ms, 3)}),
             ("reply", int(r.reply_gap_ms > 0), {"reply_gap_ms": round(r.reply_gap_ms, 3)})]
    return [{"name": name, "cat": "audio", "ph": "i", "s": "t", "pid": 1, "tid": 5, "ts": round(start_us, 3),
             "args": {"index": r.index, "count": int(n), **args}} for name, n, args in marks if n]


def _spread(values: List[float]) -> Dict[str, object]:
    return {"n": len(values), "p50": round(percentile(values, 50), 1) if values else None,
            "p90": round(percentile(values, 90), 1) if values else None,
            "max": round(max(values), 1) if values else None}


def audio_path_summary(records: Sequence[SecondRecord]) -> Dict[str, object]:
    """The conversation as the user met it, over a session's records: the reply gap (the user's last word to
    the model's first audio at the speaker) and the barge-in latency, each as count, p50, p90 and max (ms);
    the speech dropped against the seconds spoken; the echo suppression while the model spoke (p50, lowest)."""
    records = list(records)
    sup = [r.echo_suppression_db for r in records if r.echo_suppression_db]
    return {"reply_gap_ms": _spread([r.reply_gap_ms for r in records if r.reply_gap_ms > 0]),
            "barge_in_latency_ms": _spread([r.barge_in_latency_ms for r in records if r.barge_ins]),
            "spoken_s": sum(1 for r in records if r.decision == "speak"),
            "dropped_speech_ms": round(sum(r.dropped_speech_ms for r in records), 1),
            "echo_suppression_db": {"p50": round(percentile(sup, 50), 1) if sup else None,
                                    "min": round(min(sup), 1) if sup else None}}


def to_trace(records: Sequence[SecondRecord], metadata: Dict[str, object] = None) -> str:
    doc = {"traceEvents": trace_events(records), "displayTimeUnit": "ms", "otherData": dict(metadata or {})}
    return json.dumps(doc, indent=None, separators=(",", ":")) + "\n"


def export_records(records: Sequence[SecondRecord], directory, stem: str = "session",
                   metadata: Dict[str, object] = None) -> Dict[str, Path]:
    """Write ``STEM.csv``, ``STEM.jsonl`` and ``STEM.trace.json`` into ``directory``, atomically.

    Returns ``dict(csv=Path, jsonl=Path, trace=Path)``; raises :class:`ExportError` when a file
    cannot be written. ``records`` is not modified.
    """
    records = list(records)
    d = Path(directory).expanduser()
    if d.exists() and not d.is_dir():
        raise ExportError(f"cannot write {d / (stem + '.csv')}: {d} is not a folder")
    return {
        "csv": _atomic_write(d / f"{stem}.csv", to_csv(records)),
        "jsonl": _atomic_write(d / f"{stem}.jsonl", to_jsonl(records)),
        "trace": _atomic_write(d / f"{stem}.trace.json", to_trace(records, metadata)),
    }
