"""`duplexcadence-bench capacity` on the CPU: a functional dry run at tiny size, and bad arguments."""
from __future__ import annotations

import json
import os
import time

import pytest

from engine.bench import capacity
from engine.bench import ramp as ramp_bench


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
    (["--switch-interval", "0"], "--switch-interval must be between 0.01 and 1000 ms"),
    (["--cuda-connections", "33"], "--cuda-connections: the CUDA work queue count must be a whole number from 1"),
    (["--start", "9", "--max-sessions", "8"], "--start must be between 1 and --max-sessions (8), not 9"),
    (["--device", "cpu", "--tail", "step-audio2", "--checkpoint", "/nonexistent/folder"], "does not exist"),
])
def test_capacity_bad_arguments(args, msg, capsys):
    assert capacity.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and "Traceback" not in err[0]


def test_the_switch_interval_holds_for_the_run_only(tmp_path, one_torch_thread, monkeypatch):
    """``--switch-interval`` (issue 24: how long one session's thread may hold the interpreter) is set for the
    run, recorded in the JSON, and the process's own interval is back afterwards; the builds' hand-over of the
    capture lock is on by default and ``--no-hand-over`` turns it off, for the run's host only."""
    import sys
    from engine.core.gate import GATE
    seen, hand_over = [], []
    run_mode = capacity.run_mode
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")     # recorded: the run's own write is undone afterwards
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")

    def spy(*args, **kw):
        seen.append(sys.getswitchinterval())
        return run_mode(*args, **kw)
    host_init = capacity.EngineHost.__init__

    def host_spy(self, *args, **kw):
        host_init(self, *args, **kw)
        hand_over.append(GATE.hand_over)
    monkeypatch.setattr(capacity.EngineHost, "__init__", host_spy)
    monkeypatch.setattr(capacity, "run_mode", spy)
    before = sys.getswitchinterval()
    GATE.hand_over = False                   # the process's own setting (other tests' hosts may have left it on)
    out = tmp_path / "cap.json"
    rc = capacity.main(["--device", "cpu", "--size", "tiny", "--tail", "mimi", "--seconds", "1", "--window", "1",
                        "--max-sessions", "1", "--modes", "optimized", "--solo-sessions", "0",
                        "--switch-interval", "0.5", "--cuda-connections", "32", "--json", str(out)])
    assert seen == [pytest.approx(0.0005)] and sys.getswitchinterval() == before
    assert hand_over == [True] and not GATE.hand_over               # on by default, for the run's host only
    doc = json.loads(out.read_text())
    assert doc["switch_interval_ms"] == pytest.approx(0.5) and doc["hand_over"] is True
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "32" and doc["cuda_connections"] is None   # no CUDA here
    assert capacity.build_parser().parse_args(["--no-hand-over"]).hand_over is False
    # whether the one session kept the deadline on this busy CPU is not the point; either way the run is no failure:
    # a session that held is re-run alone and identical, and none that held leaves nothing to compare (None)
    m = doc["modes"]["optimized"]
    assert rc == 0 and m["bit_identical_to_solo"] is (True if m["solo_checked"] else None)


def test_the_confirmation_leaves_time_for_its_builds():
    """Session 13 on the H200: the confirmation at 4 MiniCPM-o sessions was planned for 60 s with 100 s left,
    ignoring ~80 s of builds, and the call's time ran out before it wrote its JSON. It now shortens to fit them."""
    assert ramp_bench.confirm_seconds(60, 1000, 4, 20.0) == 60
    assert ramp_bench.confirm_seconds(60, 100, 4, 20.0) == 5.0             # 100 - 25 - 80 < 5: the floor
    assert ramp_bench.confirm_seconds(60, 150, 4, 20.0) == 45.0
    assert ramp_bench.confirm_seconds(60, 100, 0, 0.0) == 60
    assert ramp_bench.confirm_seconds(60, float("inf"), 8, 20.0) == 60     # no time limit


class _Runner:
    def __init__(self, backlog: int):
        self._b = backlog

    def backlog(self) -> int:
        return self._b


class _Load:
    def __init__(self, backlogs):
        self.sessions = [type("D", (), {"runner": _Runner(b)})() for b in backlogs]


def test_the_confirmation_reserves_builds_only_for_sessions_it_makes():
    """Session 21 on the H200: the ramp ended with 16 clean Step-Audio2 sessions running, the confirmation would
    reuse them, yet 16 builds were reserved and the 60 s asked shrank to 5 s. Only the builds it makes count."""
    assert ramp_bench.builds_for(_Load([0] * 16), 16) == 0                # the ramp's sessions run on
    assert ramp_bench.builds_for(_Load([0] * 12), 16) == 4                # four more to make
    assert ramp_bench.builds_for(_Load([0, 3, 0]), 3) == 3                # a backlog: all afresh
    assert ramp_bench.builds_for(_Load([0] * 5), 4) == 4                  # more than the knee: all afresh
    assert ramp_bench.confirm_seconds(60, 120, ramp_bench.builds_for(_Load([0] * 16), 16), 12.0) == 60
    assert ramp_bench.confirm_seconds(60, 120, ramp_bench.builds_for(_Load([1] * 16), 16), 12.0) == 5.0


def test_a_ramp_step_is_only_as_big_as_its_builds_allow():
    """Session 21 on the H200: the ramp stepped from 8 to 16 Step-Audio2 sessions with ~200 s left; the eight
    builds under load took longer and the command's timeout killed the run before any JSON. A step now plans its
    builds (x1.5 the longest seen) against the ramp's time and stops the ramp when even one does not fit."""
    assert ramp_bench.step_that_fits(8, 16, 1000.0, 10.0, 3.0) == 16           # all fit
    assert ramp_bench.step_that_fits(8, 16, 80.0, 10.0, 3.0) == 12             # (80 - 8) // 15 = 4 more
    assert ramp_bench.step_that_fits(8, 16, 20.0, 10.0, 3.0) == 8              # not one: the ramp stops
    assert ramp_bench.step_that_fits(8, 5, 0.0, 10.0, 3.0) == 5                # bisecting down builds nothing
    assert ramp_bench.step_that_fits(0, 4, 100.0, 10.0, 3.0) == 4              # afresh after a miss: 4 builds fit


class _FakeLoad:
    """A PacedLoad stand-in: windows are clean, each build takes ``build_s`` of a fake clock."""

    def __init__(self, build_s: float, clock):
        self.sessions, self.longest_build_s, self.clock = [], 0.0, clock
        self.build_s = build_s

        self.held = 0

    def add(self, cfg, frames, hold=False):
        self.clock[0] += self.build_s
        self.longest_build_s = self.build_s
        self.sessions.append(type("D", (), {"runner": _Runner(0)})())

    def release(self):
        pass

    def remove_last(self):
        self.sessions.pop()

    def settle(self, timeout):
        return True

    def measure(self, seconds, progress=None):
        self.clock[0] += seconds
        from engine.host.drive import Window
        return Window(len(self.sessions), len(self.sessions), 0, 100.0, 200.0, 210.0, [])


def test_the_ramp_stops_where_the_next_builds_would_outrun_its_time(monkeypatch, capsys):
    clock = [0.0]
    monkeypatch.setattr(ramp_bench.time, "perf_counter", lambda: clock[0])
    load = _FakeLoad(build_s=20.0, clock=clock)
    knee, points = ramp_bench.ramp(load, None, [[]] * 64, "optimized", 64, 3.0, 200.0)
    # 1 (20 s + 3), 2 (+20 + 3), 4 (+40 + 3): 111 s left; 8 wants 4 builds (x1.5: 120 s): 3 fit, so 7 (+60 + 3);
    # 48 s left: 14 wanted, 1 build fits, so 8 (+20 + 3); 25 s left: not one more
    assert sorted(points) == [1, 2, 4, 7, 8] and knee == 8 and len(load.sessions) == 8
    assert "ramp stopped at 8" in capsys.readouterr().err
    assert clock[0] <= 200.0                                               # the ramp kept to its time


def test_start_sends_the_optimized_ramp_straight_to_a_known_count(monkeypatch, tmp_path, one_torch_thread):
    starts = {}

    def fake_run_mode(mode, base, a, launch, inputs, ramp_only=False, start=1):
        starts[mode] = start
        raise RuntimeError("not run in this test")

    monkeypatch.setattr(capacity, "run_mode", fake_run_mode)
    capacity.main(["--device", "cpu", "--size", "tiny", "--max-sessions", "16", "--start", "12",
                   "--modes", "stock,optimized,batched", "--json", str(tmp_path / "c.json")])
    assert starts == {"stock": 1, "optimized": 12, "batched": 12}


def test_a_run_cut_short_keeps_its_windows_in_the_json(tmp_path, one_torch_thread, monkeypatch):
    """The JSON is written as the run goes: cut in the middle of a mode (a call's timeout, simulated by an
    interrupt right after the first window was written), it still holds the ramp's window, marked in progress."""
    out = tmp_path / "cap.json"
    write = capacity._write

    def write_then_cut(doc, a):
        write(doc, a)
        if any("ramp" in m for m in doc["modes"].values()):
            raise KeyboardInterrupt("the call's timeout")
    monkeypatch.setattr(capacity, "_write", write_then_cut)
    with pytest.raises(KeyboardInterrupt):
        capacity.main(["--device", "cpu", "--size", "tiny", "--tail", "mimi", "--seconds", "2", "--window", "1",
                       "--max-sessions", "2", "--modes", "stock", "--solo-sessions", "0", "--json", str(out)])
    doc = json.loads(out.read_text())
    m = doc["modes"]["stock-like"]
    assert m["in_progress"] is True and m["ramp"][0]["sessions"] == 1 and m["ramp"][0]["window_s"] == 1
    assert "max_sessions" not in m


def test_the_confirmation_ticker_reports_what_it_prints():
    seen = []

    class Load:
        def window(self, start, end):
            from types import SimpleNamespace
            return SimpleNamespace(misses=1, max_ms=412.0, p99_ms=400.0)
    tick = ramp_bench._ticker(Load(), "optimized", 60.0, 4, lambda key, value: seen.append((key, value)))
    tick(5.0)
    tick(10.5)
    assert seen == [("confirmation_so_far", {"sessions": 4, "planned_s": 60.0, "ran_s": 10.5, "late": 1,
                                             "worst_ms": 412.0, "p99_ms": 400.0})]


def test_a_confirmation_cut_short_by_the_time_limit_says_so():
    """Session 20 on the H200: the time limit left the 32-session Mimi confirmation 5 s of the 60 asked, and the
    report read "60 s at the knee". The table now shows how long each confirmation held, and a shortened one gets
    its own line saying it is not the confirmation asked for."""
    mem = {"per_session_allocated_bytes": 160 << 20, "per_session_state_bytes": 1 << 20,
           "shared_weights_bytes": 1 << 30}

    def mode(held):
        return {"launch": "threads", "max_sessions": 32, "p50_ms": 223.0, "p99_ms": 376.0, "memory": mem,
                "bit_identical_to_solo": True,
                "confirmation": {"sessions": 32, "seconds": int(32 * held), "misses": 0, "seconds_run": held}}
    doc = {"seconds": 60.0, "modes": {"optimized": mode(5.0), "stock-like": mode(60.0)}}
    printed = capacity.table(doc, wrap=False)
    assert "held s" in printed
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in printed.splitlines() if line.startswith("| optimized") or line.startswith("| stock-like")}
    assert rows["optimized"][3] == "5" and rows["stock-like"][3] == "60"
    assert capacity.shortened(doc) == ["optimized: 32 session(s) held 5 s, not the 60 s asked (--time-limit left "
                                       "no more): not confirmed at 60 s"]


class _BuildHost:
    """A host stand-in whose runners note when they were built and when their first frame came."""

    def __init__(self):
        self.log, self.opened = [], 0

    def open(self, cfg, force=True):
        import queue
        import threading
        import types
        host = self

        class Runner:
            def __init__(self):
                self.session, self.ready, self.results = object(), threading.Event(), queue.Queue()
                self.name = f"s{host.opened}"
                host.opened += 1

            def start(self):
                time.sleep(0.3)                                          # a build takes time
                host.log.append(("built", self.name))
                self.ready.set()

            def submit(self, frame, arrival):
                if ("fed", self.name) not in host.log:
                    host.log.append(("fed", self.name))

            def backlog(self):
                return 0

            def stop(self, timeout=0.0):
                pass
        return Runner()


def test_several_new_sessions_are_all_built_before_any_is_fed():
    """Session 22 on the H200: 16 Step-Audio2 sessions built one by one, each beside the seconds of those built
    before it, took ~400 s of a 440 s limit and left the 60 s confirmation 5 s. A step that adds several sessions
    now builds them all, then feeds them; a single new session starts at once."""
    import numpy as np
    from engine.host.drive import PacedLoad
    host = _BuildHost()
    load = PacedLoad(host)
    try:
        frames = [[np.zeros(4, np.float32)]] * 4
        ramp_bench.set_count(load, None, frames, 3)
        time.sleep(1.3)
        kinds = [k for k, _ in host.log]
        assert kinds[:3] == ["built"] * 3 and sorted(kinds[3:]) == ["fed"] * 3 and load.held == 0
        ramp_bench.set_count(load, None, frames, 4)                 # one more: built and fed at once
        assert host.log[6] == ("built", "s3") and len(load.sessions) == 4
        phases = sorted(round((d.t0 - load.sessions[0].t0) % 1.0, 3) for d in load.sessions[:3])
        assert len(set(phases)) == 3                                  # each its own phase
    finally:
        load.close()


def test_the_rounds_mode_reports_its_groups_and_why_sessions_step_alone(tmp_path, one_torch_thread):
    """``--modes rounds`` (MiniCPM-o's LLM rounds): on the CPU its sessions step alone and the JSON says why; the
    groups' report is there (empty). The rounds' own bits are tests/test_minicpmo45_rounds.py's."""
    out = tmp_path / "cap.json"
    rc = capacity.main(["--device", "cpu", "--size", "tiny", "--tail", "step-audio2", "--backbone", "minicpm-o-4.5",
                        "--seconds", "1", "--window", "1", "--max-sessions", "1", "--modes", "rounds",
                        "--solo-sessions", "0", "--json", str(out)])
    m = json.loads(out.read_text())["modes"]["rounds"]
    assert rc == 0 and m["llm_rounds"] == []
    assert m["llm_rounds_notes"] and all(n.startswith("LLM rounds need CUDA graph replay") for n in m["llm_rounds_notes"])
