"""The scripted run without headphones (app/echo_run.py): how it reads the app's export against the user's
timeline, its one-line refusals, and a half-minute run through a private PulseAudio server (app/pulse.py)."""
from __future__ import annotations

import json
import shutil

import pytest

from app import echo_run


def _rec(index, wall, barge=0, speech=False, sup=0.0, decision="listen", gap=0.0):
    return {"index": index, "wall_start": wall, "queue_wait_ms": 100.0, "total_ms": 400.0, "barge_ins": barge,
            "user_speech": speech, "echo_suppression_db": sup, "decision": decision, "dropped_speech_ms": 0.0,
            "reply_gap_ms": gap}


def test_a_barge_in_far_from_every_user_turn_is_a_self_interruption():
    turns = [(1000.0, 1003.0)]
    recs = [_rec(0, 1002.0, barge=1, speech=True, sup=30.0),            # the user talks: theirs
            _rec(1, 1010.0, barge=1, sup=25.0, decision="speak"),        # 7 s after the turn: the echo
            _rec(2, 1011.0, speech=True, sup=22.0, decision="speak", gap=1800.0),
            _rec(60, 1070.0, sup=0.0)]                                   # minute 1: nothing measured
    rows = echo_run.minutes(recs, turns)
    assert [m["minute"] for m in rows] == [0, 1]
    m0 = rows[0]
    assert (m0["barge_ins"], m0["self_interrupts"], m0["echo_heard_s"], m0["spoken_s"]) == (2, 1, 1, 2)
    assert (m0["suppression_db_min"], m0["measured_s"]) == (22.0, 3) and m0["reply_gap_ms"] == [1800.0]
    doc = echo_run.summarize(rows, {})
    assert doc["self_interrupts"] == 1 and doc["reply_gap_s"]["p50"] == 1.8
    assert doc["meets_targets"] == {"self_interrupts": False, "suppression_every_minute": False}   # minute 1


def test_bad_options_are_one_line(capsys):
    if shutil.which("pulseaudio") is None:
        pytest.skip("PulseAudio missing (the Makefile's sysdeps installs it)")
    assert echo_run.main(["--minutes", "0.1"]) == 2
    assert echo_run.main(["--gain-db", "12"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--minutes" in err[0] and "--gain-db" in err[1]


def test_half_a_minute_of_the_app_with_its_speaker_in_its_microphone(tmp_path):
    missing = [t for t in echo_run.TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (the Makefile's sysdeps installs them)")
    assert echo_run.main(["--minutes", "0.5", "--gain-db", "-13", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "echo-run.json").read_text())
    assert doc["seconds"] == 30 and doc["user_turns"] >= 2 and doc["spoken_s"] >= 3, doc
    assert doc["self_interrupts"] == 0 and doc["echo_heard_s"] == 0, doc
    assert doc["suppression_db_lowest_minute"] >= echo_run.TARGET_SUPPRESSION_DB, doc
    assert (tmp_path / "export" / "summary.json").exists() and (tmp_path / "echo-run.md").exists()
