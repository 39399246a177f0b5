"""The window's numbers without Qt: percentiles over the last 60 s, colours, series, event log."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.viewmodel import (GREEN, MIB, RED, YELLOW, EventLog, SessionSeries, format_bytes, percentile,
                           traffic_light)

RNG = np.random.default_rng(7)


def row(i: int, total: float, missed: bool = False, late: float = 0.0, **kw) -> dict:
    r = dict(index=i, wall_start=1.7e9 + i, listen_ms=total * 0.2, think_ms=total * 0.3, speak_ms=total * 0.5,
             total_ms=total, deadline_ms=1000.0, late_ms=late, missed=missed, queue_wait_ms=0.0,
             decision="speak" if i % 3 else "listen", tokens=25, state_bytes=(10 + i) * MIB, alloc_bytes=0,
             reserved_bytes=2 * (10 + i) * MIB, peak_bytes=0, demand_sized=True, graph_replay=False,
             tail="mimi", backbone="synthetic", input_rms=0.1, output_rms=0.1, backlog=0, text="")
    r.update(kw)
    return r


def test_percentile_matches_numpy():
    v = RNG.uniform(10, 900, size=57).tolist()
    for q in (50, 90, 99):
        assert percentile(v, q) == pytest.approx(float(np.percentile(v, q)))
    assert percentile([], 50) == 0.0


def test_traffic_light_and_bytes():
    assert traffic_light(100, 700, 1000) == GREEN
    assert traffic_light(700, 700, 1000) == YELLOW
    assert traffic_light(1000, 700, 1000) == RED
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 1024 + 512) == "3.5 KiB"
    assert format_bytes(41 * MIB) == "41.0 MiB"
    assert format_bytes(2.5 * 1024 ** 3) == "2.50 GiB"


def test_summary_looks_at_the_last_60_seconds_only():
    s = SessionSeries()
    totals = RNG.uniform(100, 400, size=100)
    totals[:40] = 5000.0                               # an awful start, more than 60 s ago
    for i, t in enumerate(totals):
        s.add(row(i, float(t), missed=t > 1000, late=max(0.0, t - 1000)))
    summ = s.summary()
    last60 = totals[-60:]
    assert summ.seconds == 100
    assert summ.p50_ms == pytest.approx(float(np.percentile(last60, 50)))
    assert summ.p99_ms == pytest.approx(float(np.percentile(last60, 99)))
    assert summ.misses == 40 and summ.misses_window == 0
    assert summ.lateness_ms == 0.0
    assert summ.colours["p99"] == GREEN and summ.colours["misses"] == GREEN
    assert summ.state_bytes == 109 * MIB and summ.reserved_bytes == 218 * MIB
    text = summ.text()
    assert text["p50"].startswith("p50 ") and text["misses"] == "misses 40 (0 in 60 s)"


def test_summary_colours_turn_red_when_late():
    s = SessionSeries()
    for i in range(5):
        s.add(row(i, 1300.0, missed=True, late=300.0 * (i + 1), backlog=i))
    summ = s.summary()
    assert summ.colours["p50"] == RED and summ.colours["p99"] == RED
    assert summ.colours["misses"] == RED and summ.colours["lateness"] == RED
    assert summ.lateness_ms == 1500.0 and summ.backlog == 4


def test_series_columns_and_mode_changes():
    s = SessionSeries()
    assert s.summary().seconds == 0
    for i in range(6):
        s.add(row(i, 200.0 + i, demand_sized=i < 3, missed=i == 4))
    assert s.index().tolist() == list(range(6))
    st = s.stages()
    assert np.allclose(st["listen"] + st["think"] + st["speak"], s.column("total_ms"))
    assert s.missed().tolist() == [False] * 4 + [True, False]
    assert np.allclose(s.memory_mib()["state"], np.arange(10, 16))
    (change,) = s.mode_changes()
    assert (change["index"], change["demand_sized"], change["graph_replay"], change["label"]) == (3, False, False,
                                                                                                  "stock-like")
    s.add(dict(row(6, 200.0, demand_sized=False), force_listen=True, barge_in_sensitivity="normal",
               playback_delay_s=0.5))
    s.add(dict(row(7, 200.0, demand_sized=False), force_listen=True, barge_in_sensitivity="high",
               playback_delay_s=1.5, echo_cancellation=True))
    assert [c["label"] for c in s.mode_changes()[1:]] == ["force-listen on", "echo on, interrupt high, delay 1.5 s"]
    w = s.window(4)
    assert w.index().tolist() == [4, 5, 6, 7] and len(s) == 8


def test_event_log_json_and_lines():
    log = EventLog(limit=3)
    for k in range(5):
        log.add("toggle", f"event {k}", {"k": k}, when=1.7e9 + k)
    data = json.loads(log.to_json())
    assert [d["text"] for d in data] == ["event 2", "event 3", "event 4"]
    assert data[0]["data"] == {"k": 2} and data[0]["kind"] == "toggle"
    assert log.events[-1].line().endswith("toggle    event 4")


def test_keep_up_advice_names_what_would_help_here():
    from app.viewmodel import keep_up_advice
    cpu = keep_up_advice({"device": "cpu", "size": "released", "fast_paths": []}, cuda=False)
    assert "run on a GPU" in cpu and "tiny size" in cpu and "CPU" in cpu
    tiny = keep_up_advice({"device": "cpu", "size": "tiny", "fast_paths": ["mimi conv: forced reference"]},
                          cuda=False)
    assert "tiny size" not in tiny and "faster paths" in tiny
    gpu = keep_up_advice({"device": "cuda:0", "size": "released", "graph_replay": False}, cuda=True)
    assert "run on a GPU" not in gpu and "smaller size" in gpu and "graph replay on" in gpu


def test_transcript_lines_and_text():
    from app.transcript import transcript_lines, transcript_text
    rows = [dict(index=i, user_speech=i in (1, 2, 6), decision="speak" if i in (3, 4) else "listen",
                 text="hi there" if i == 3 else "") for i in range(7)]
    assert transcript_lines(rows) == ["[1–2 s] user speaking", "[3 s] model: hi there", "[4 s] model: —",
                                      "[6 s] user speaking (…)"]
    assert transcript_text(rows).splitlines()[1:] == transcript_lines(rows)
