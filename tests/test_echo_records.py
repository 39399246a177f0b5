"""The per-second audio-path fields: defaults when absent, in every export."""
from __future__ import annotations

import json

from engine.session.export import to_csv, to_jsonl, to_trace
from engine.session.records import SecondRecord

NEW = {"barge_ins": 0, "barge_in_latency_ms": 0.0, "playback_gaps": 0, "playback_gap_ms": 0.0,
       "echo_suppression_db": 0.0, "dropped_speech_ms": 0.0}


def record(**extra) -> SecondRecord:
    base = dict(index=3, wall_start=100.0, listen_ms=1.0, think_ms=2.0, speak_ms=3.0, total_ms=6.0, deadline_ms=1000.0,
                late_ms=0.0, missed=False, queue_wait_ms=0.0, decision="speak", tokens=12, state_bytes=1, alloc_bytes=0,
                reserved_bytes=0, peak_bytes=0, demand_sized=True, graph_replay=False, tail="mimi", backbone="synthetic",
                input_rms=0.1, output_rms=0.1)
    return SecondRecord(**{**base, **extra})


def test_old_records_get_the_defaults():
    r = record()                                             # as an old journal line would build it
    assert {k: getattr(r, k) for k in NEW} == NEW


def test_every_export_carries_the_audio_path_fields():
    r = record(barge_ins=1, barge_in_latency_ms=123.4, playback_gaps=2, playback_gap_ms=40.0,
               echo_suppression_db=41.5, dropped_speech_ms=250.0)
    header = to_csv([r]).splitlines()[0].split(",")
    assert all(k in header for k in NEW)
    row = json.loads(to_jsonl([r]))
    assert row["barge_in_latency_ms"] == 123.4 and row["playback_gaps"] == 2 and row["dropped_speech_ms"] == 250.0
    events = json.loads(to_trace([r]))["traceEvents"]
    marks = {e["name"]: e["args"] for e in events if e.get("cat") == "audio"}
    assert marks["barge-in"]["latency_ms"] == 123.4
    assert marks["playback gap"]["count"] == 2 and marks["dropped speech"]["dropped_ms"] == 250.0
    assert not [e for e in json.loads(to_trace([record()]))["traceEvents"] if e.get("cat") == "audio"]
