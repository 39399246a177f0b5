"""The reply gap (the end of the user's speech to the model's first audio at the speaker), per turn: measured by
the audio path, in the records and every export, p50/p90 on a chip (engine/echo/replygap.py,
engine/session/export.py, app/readouts.py)."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

from engine.echo.bargein import BargeInDetector
from engine.echo.replygap import ReplyGapMeter
from engine.session.export import audio_path_summary, to_csv, to_jsonl, to_trace
from engine.session.records import SecondRecord

RATE = 24000


def _talk(n: int, level: float = 0.2, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * level).astype(np.float32)


def _run(mic: np.ndarray, far: np.ndarray, extra_ms: float = 0.0):
    det, meter = BargeInDetector(RATE), ReplyGapMeter(RATE)
    quiet = np.zeros(RATE, np.float32)
    det.push(quiet + _talk(RATE, 1e-4, 9), playing=False)       # a noise floor first
    meter.push(np.zeros(RATE, np.float32), det, extra_ms)
    for i in range(0, mic.size, 480):
        det.push(mic[i:i + 480], playing=False)
        meter.push(far[i:i + 480], det, extra_ms)
    return meter


def test_a_turn_and_its_reply_give_one_gap_with_the_latencies_outside_the_path():
    mic, far = np.zeros(6 * RATE, np.float32), np.zeros(6 * RATE, np.float32)
    mic[RATE // 2: 2 * RATE] = _talk(3 * RATE // 2)             # the user talks 0.5 - 2.0 s
    far[int(3.7 * RATE): 5 * RATE] = _talk(int(1.3 * RATE), 0.1, 1)   # the model answers from 3.7 s
    meter = _run(mic, far, extra_ms=60.0)
    assert list(meter.gaps_ms) == [pytest.approx(1700.0 + 60.0, abs=21.0)]
    assert meter.overlapped == 0 and meter.unanswered == 0


def test_turns_without_a_gap_are_counted_not_measured():
    mic, far = np.zeros(8 * RATE, np.float32), np.zeros(8 * RATE, np.float32)
    mic[RATE: 2 * RATE] = _talk(RATE)                            # talks while the model speaks: overlapped
    far[int(0.5 * RATE): int(2.5 * RATE)] = _talk(2 * RATE, 0.1, 1)
    mic[4 * RATE: 5 * RATE] = _talk(RATE, seed=2)                # talks, then again before any reply
    mic[int(5.8 * RATE): int(6.5 * RATE)] = _talk(int(0.7 * RATE), seed=3)
    meter = _run(mic, far)
    assert not meter.gaps_ms and meter.overlapped == 1 and meter.unanswered == 1


def _record(**kw) -> SecondRecord:
    base = dict(index=0, wall_start=100.0, listen_ms=1.0, think_ms=2.0, speak_ms=3.0, total_ms=6.0, deadline_ms=1000.0,
                late_ms=0.0, missed=False, queue_wait_ms=0.0, decision="speak", tokens=12, state_bytes=1, alloc_bytes=0,
                reserved_bytes=0, peak_bytes=0, demand_sized=True, graph_replay=False, tail="mimi", backbone="synthetic",
                input_rms=0.1, output_rms=0.1)
    return SecondRecord(**{**base, **kw})


def test_every_export_carries_the_reply_gap_and_its_spread():
    recs = [_record(index=k, wall_start=100.0 + k, reply_gap_ms=g, barge_ins=int(b > 0), barge_in_latency_ms=b)
            for k, (g, b) in enumerate([(1500.0, 0), (0.0, 90.0), (2100.0, 0), (1800.0, 120.0), (0.0, 0)])]
    assert "reply_gap_ms" in to_csv(recs).splitlines()[0].split(",")
    assert json.loads(to_jsonl(recs).splitlines()[2])["reply_gap_ms"] == 2100.0
    marks = [e for e in json.loads(to_trace(recs))["traceEvents"] if e.get("name") == "reply"]
    assert [m["args"]["reply_gap_ms"] for m in marks] == [1500.0, 2100.0, 1800.0]
    s = audio_path_summary(recs)
    assert s["reply_gap_ms"] == {"n": 3, "p50": 1800.0, "p90": 2040.0, "max": 2100.0}
    assert s["barge_in_latency_ms"]["n"] == 2 and s["barge_in_latency_ms"]["p50"] == 105.0
    assert audio_path_summary([])["reply_gap_ms"] == {"n": 0, "p50": None, "p90": None, "max": None}


def test_the_chip_shows_the_median_and_the_90th_percentile(qtbot):
    from app.readouts import ReadoutRow
    row = ReadoutRow()
    qtbot.addWidget(row)
    assert row.labels["reply"].text() == "reply —"
    rows = [{"reply_gap_ms": g, "echo_cancellation": True} for g in (1500.0, 0.0, 2100.0, 1800.0)]
    row.show_row(rows[-1], rows=rows)
    assert row.labels["reply"].text() == "reply 1.8 s · p90 2.0 (3)"
    row.reset()
    for r in rows:                                   # live: one second at a time
        row.show_row(r, {})
    assert row.labels["reply"].text() == "reply 1.8 s · p90 2.0 (3)"


def test_the_app_records_the_gap_in_the_second_the_reply_began():
    """The controller's per-second fill takes the gaps the pump's path measured since the last second."""
    from app.conversation import ConversationControls
    path = types.SimpleNamespace(new_reply_gaps=lambda: [1900.0])
    pump = types.SimpleNamespace(canceller=None, barge_ins=0, barge_in_ms=[], path=path, far_db=-120.0,
                                 playback=None)
    ctl = types.SimpleNamespace(pump=pump, controls=types.SimpleNamespace(sensitivity="normal"), _requests=[],
                                _last_barge_ins=0)
    rec = _record()
    ConversationControls._fill_audio_path(ctl, rec)
    assert rec.reply_gap_ms == 1900.0
