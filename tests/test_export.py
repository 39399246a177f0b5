"""Session exports: CSV columns, JSON Lines, Chrome-trace schema, atomic writes, clear errors."""
from __future__ import annotations

import csv
import json
import os

import pytest

from engine.session import ExportError, SecondRecord, export_records
from engine.session.records import format_summary, lateness, percentile, summarize


def _records(n=5):
    out = []
    for k in range(n):
        listen, think, speak = 10.0 + k, 20.0 + 2 * k, 30.0 + 3 * k
        wait = 400.0 * k if k >= 3 else 0.0
        total = listen + think + speak + 1.5
        late, missed = lateness(wait, total)
        out.append(SecondRecord(
            index=k, wall_start=1_700_000_000.0 + k * 1.0001, listen_ms=listen, think_ms=think, speak_ms=speak,
            total_ms=total, deadline_ms=1000.0, late_ms=late, missed=missed, queue_wait_ms=wait,
            decision="speak" if k % 2 else "listen", tokens=25 if k % 2 else 0, state_bytes=1000 + k,
            alloc_bytes=10 * k, reserved_bytes=20 * k, peak_bytes=30 * k, demand_sized=bool(k % 2),
            graph_replay=False, tail="step-audio2", backbone="synthetic", input_rms=0.1, output_rms=0.05,
            user_speech=not k % 2, backlog=max(0, k - 2)))
    return out


def test_exports_parse(tmp_path):
    recs = _records()
    paths = export_records(recs, tmp_path / "logs", stem="s1")
    assert set(paths) == {"csv", "jsonl", "trace"}
    with open(paths["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0].keys()) == SecondRecord.columns()
    assert [int(r["index"]) for r in rows] == list(range(5))
    assert rows[4]["missed"] == "True" and float(rows[4]["late_ms"]) == pytest.approx(recs[4].late_ms, abs=1e-5)
    lines = paths["jsonl"].read_text().splitlines()
    assert [json.loads(l) for l in lines] == [r.to_dict() for r in recs]


def test_trace_schema(tmp_path):
    recs = _records()
    doc = json.loads(export_records(recs, tmp_path)["trace"].read_text())
    events = doc["traceEvents"]
    stages = [e for e in events if e.get("cat") == "stage"]
    assert len(stages) == 3 * len(recs)                      # one complete event per stage per second
    for e in stages:
        assert e["ph"] == "X" and e["name"] in ("LISTEN", "THINK", "SPEAK")
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["pid"] == 1
    # microseconds from the first second; stages of a second follow each other
    s1 = [e for e in stages if e["args"]["index"] == 1]
    assert s1[0]["ts"] == pytest.approx(1.0001e6, abs=1.0)
    assert s1[1]["ts"] == pytest.approx(s1[0]["ts"] + recs[1].listen_ms * 1000, abs=1e-2)
    assert s1[2]["dur"] == pytest.approx(recs[1].speak_ms * 1000)
    seconds = [e for e in events if e.get("cat") == "second"]
    assert len(seconds) == len(recs)
    missed = [e for e in events if e.get("cat") == "deadline"]
    assert [e["args"]["index"] for e in missed] == [r.index for r in recs if r.missed]
    queued = [e for e in events if e.get("cat") == "queue"]
    assert len(queued) == sum(1 for r in recs if r.queue_wait_ms > 0)
    assert any(e["ph"] == "M" for e in events)


def test_trace_marks_toggles_and_requests():
    """Perfetto shows where a toggle or control was asked and the second from which it was in effect."""
    from engine.session.export import trace_events
    recs = _records()                                        # demand_sized: off, on, off, on, off
    recs[2].requests = "echo cancellation off"
    recs[3].echo_cancellation = True
    marks = [e for e in trace_events(recs) if e.get("cat") == "toggle"]
    assert all(e["tid"] == 6 and e["ph"] == "i" for e in marks)
    assert [(e["args"]["index"], e["name"]) for e in marks] == [
        (1, "in effect: demand_sized on"), (2, "requested: echo cancellation off"), (2, "in effect: demand_sized off"),
        (3, "in effect: demand_sized on, echo_cancellation on"), (4, "in effect: demand_sized off, echo_cancellation off")]
    assert marks[2]["ts"] == pytest.approx(2.0002e6, abs=1.0)


def test_atomic_and_unwritable(tmp_path):
    recs = _records()
    before = [r.to_dict() for r in recs]
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ExportError, match="cannot write"):
        export_records(recs, blocker)
    with pytest.raises(ExportError, match="cannot write"):
        export_records(recs, blocker / "sub")
    if os.geteuid() != 0:                                    # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ExportError, match="cannot write"):
            export_records(recs, ro)
    assert [r.to_dict() for r in recs] == before             # records untouched
    out = tmp_path / "ok"
    export_records(recs, out)
    export_records(recs[:2], out)                            # overwrite in place
    assert sorted(p.name for p in out.iterdir()) == ["session.csv", "session.jsonl", "session.trace.json"]
    assert len(out.joinpath("session.jsonl").read_text().splitlines()) == 2


def test_summary_numbers():
    recs = _records()
    s = summarize(recs)
    assert s["seconds"] == 5 and s["misses"] == sum(r.missed for r in recs)
    assert s["p50_total_ms"] == pytest.approx(percentile([r.total_ms for r in recs], 50))
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([5.0], 99) == 5.0
    assert "missed" in format_summary(s)
    d = recs[0].to_dict()
    assert set(d) == set(SecondRecord.columns()) and json.loads(json.dumps(d)) == d
