"""The long echo bench and the drift bench, shortened (their full ten-minute runs are in docs/results/ and
docs/echo.md): the app's audio path against simulated devices on clocks of their own (engine/bench/echo_long.py,
drift.py)."""
from __future__ import annotations

import json

import pytest

from engine.bench import drift, echo_long


@pytest.mark.parametrize("speeds", ["0.81:1.0", "1.05:0.88"])
def test_a_minute_without_headphones_on_clocks_19_percent_apart(speeds):
    """A simulated minute: the speaker at 81 % of its rate (or 105 %, the microphone at 88 %), the echo path's
    delay jumping (+60 ms at 24 s, -90 ms at 48 s) and its gain ramping (-4, +3 dB), three bursts of
    interruptions (double talk at each): no self-interruption, the echo down by 20 dB and more, nothing dropped,
    the app's reply-gap meter agreeing with the simulation's truth."""
    a = echo_long.build_parser().parse_args(["--minutes", "1", "--gain-db", "-13", "--speeds", speeds,
                                             "--steps", "5", "--modes", "on", "--quiet", "--out", ""])
    doc = echo_long.run(a, [])
    on = doc["modes"]["on"]
    why = json.dumps({k: v for k, v in on.items() if k != "minutes"})
    assert on["self_interrupts"] == 0 and on["echo_heard_s"] == 0, why
    assert on["suppression_db_min"] >= 20.0, why
    assert on["dropped_speech_s"] == 0.0 and on["barge_ins"] >= 5 and on["false_barge_ins"] <= 1, why
    assert on["reply_gap_s"]["n"] >= 3, why
    assert on["reply_gap_s_app"]["p50"] == pytest.approx(on["reply_gap_s"]["p50"], abs=0.1), why
    assert doc["meets_targets"] == {"self_interrupts": True, "suppression_every_minute": True}


def test_the_drift_bench_drops_nothing_and_keeps_the_delay_bounded(tmp_path, capsys):
    out = tmp_path / "drift"
    assert drift.main(["--minutes", "0.5", "--speeds", "0.81:1.0,1.05:0.95", "--quiet", "--out", str(out)]) == 0
    doc = json.loads((out / "drift.json").read_text())
    assert set(doc["runs"]) == {"0.81:1.0", "1.05:0.95"} and doc["commit"] and doc["command"].startswith("duplex")
    for pair, r in doc["runs"].items():
        assert r["dropped_speech_s"] == 0.0 and r["spoken_s"] >= 8, (pair, r)
        assert r["mic_to_speaker_s"]["max"] <= 0.5 + 1.5, (pair, r)
        assert all(r["meets_targets"].values()), (pair, r)
    assert "dropped 0.0 of" in capsys.readouterr().out


def test_bad_options_are_one_line(capsys):
    assert echo_long.main(["--minutes", "0.75", "--speeds", "2:1", "--quiet", "--out", ""]) == 2
    assert drift.main(["--speeds", "fast", "--quiet", "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--speeds" in err[0] and "--speeds" in err[1]
