"""`duplexcadence-bench capacity` on the CPU: a functional dry run at tiny size, and bad arguments."""
from __future__ import annotations

import json

import pytest

from engine.bench import capacity


def test_capacity_dry_run_cpu(tmp_path, one_torch_thread, capsys):
    out = tmp_path / "cap.json"
    rc = capacity.main(["--device", "cpu", "--size", "tiny", "--tail", "mimi", "--seconds", "2", "--window", "1",
                        "--max-sessions", "2", "--modes", "stock,optimized,batched", "--solo-seconds", "2",
                        "--solo-sessions", "0", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    for mode in ("stock-like", "optimized"):
        m = doc["modes"][mode]
        assert m["max_sessions"] >= 1 and m["bit_identical_to_solo"] is True
        assert m["confirmation"]["misses"] == 0 and m["ramp"][0]["sessions"] == 1
        assert len(m["solo_checked"]) == m["ramp_knee"] >= 1
        assert m["memory"]["per_session_state_bytes"] > 0 and m["memory"]["shared_weights_bytes"] > 0
    assert doc["modes"]["batched"]["batched_enabled"] is False and "CUDA" in doc["modes"]["batched"]["batched_why"]
    printed = capsys.readouterr().out
    assert "max sessions" in printed and "bit-identical" in printed
    md = (tmp_path / "cap.md").read_text()
    assert "| optimized" in md and "| stock-like" in md and "Command:" in md
    pytest.importorskip("matplotlib")
    assert (tmp_path / "cap.png").stat().st_size > 1000 and f"plot: {tmp_path / 'cap.png'}" in printed


@pytest.mark.parametrize("args, msg", [
    (["--modes", "fast"], "unknown mode"),
    (["--seconds", "0"], "--seconds must be positive"),
    (["--max-sessions", "0"], "--max-sessions"),
    (["--device", "cpu", "--tail", "step-audio2", "--checkpoint", "/nonexistent/folder"], "does not exist"),
])
def test_capacity_bad_arguments(args, msg, capsys):
    assert capacity.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and "Traceback" not in err[0]


def test_the_confirmation_leaves_time_for_its_builds():
    """Session 13 on the H200: the confirmation at 4 MiniCPM-o sessions was planned for 60 s with 100 s left,
    ignoring ~80 s of builds, and the call's time ran out before it wrote its JSON. It now shortens to fit them."""
    assert capacity.confirm_seconds(60, 1000, 4, 20.0) == 60
    assert capacity.confirm_seconds(60, 100, 4, 20.0) == 5.0             # 100 - 25 - 80 < 5: the floor
    assert capacity.confirm_seconds(60, 150, 4, 20.0) == 45.0
    assert capacity.confirm_seconds(60, 100, 0, 0.0) == 60
    assert capacity.confirm_seconds(60, float("inf"), 8, 20.0) == 60     # no time limit
