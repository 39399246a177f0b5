"""`duplexcadence-bench capacity` on the CPU: a functional dry run at tiny size, the steps and the knee, every
session against its reference, and bad arguments."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

from engine.bench import capacity
from engine.bench import ramp as ramp_bench
from engine.bench import reference


def test_capacity_dry_run_cpu(tmp_path, one_torch_thread, capsys):
    out = tmp_path / "cap.json"
    rc = capacity.main(["--device", "cpu", "--size", "tiny", "--tail", "mimi", "--seconds", "2", "--counts", "1,2",
                        "--modes", "stock,optimized,batched", "--alone", "1", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0, doc
    for mode in ("stock-like", "optimized", "batched"):
        m = doc["modes"][mode]
        assert m["bit_identical_to_solo"] is True, m
        assert [w["sessions"] for w in m["steps"]][0] == 1
        assert all(v["identical"] and v["seconds"] > 0 for v in m["own_steps"].values()) and len(m["alone"]) == 1
        w = m["steps"][0]
        assert {"mean_ms", "p99_ms", "misses", "gpu_busy_percent", "scheduler", "memory"} <= set(w)
        assert w["memory"]["shared_weights_mib"] > 0 and w["per_session"][0]["series"]
    assert doc["provenance"]["commit"] and doc["torch"] and doc["counts"] == [1, 2]
    printed = capsys.readouterr().out
    assert "bit-identical" in printed and "session(s) on time" in printed
    md = (tmp_path / "cap.md").read_text()
    assert "| optimized" in md and "| stock-like" in md and "Command:" in md
    pytest.importorskip("matplotlib")
    assert (tmp_path / "cap.png").stat().st_size > 1000 and f"plot: {tmp_path / 'cap.png'}" in printed


@pytest.mark.parametrize("args, msg", [
    (["--modes", "fast"], "unknown mode"),
    (["--seconds", "0"], "--seconds must be a positive number"),
    (["--seconds", "nan"], "--seconds"),
    (["--counts", "0,4"], "--counts must name at least one count, each at least 1"),
    (["--counts", "a,b"], "--counts takes whole numbers"),
    (["--cuda-connections", "33"], "--cuda-connections: the CUDA work queue count must be a whole number from 1"),
    (["--device", "cpu", "--tail", "step-audio2", "--checkpoint", "/nonexistent/folder"], "does not exist"),
])
def test_capacity_bad_arguments(args, msg, capsys):
    try:
        rc = capacity.main(args)
    except SystemExit as e:                   # refused by the parser itself (a number that is not finite)
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and "Traceback" not in err[0]


class _Load:
    """A PacedLoad stand-in: a window is late from ``late_from`` sessions on; counts every build."""

    def __init__(self, late_from: int):
        self.sessions, self.late_from, self.builds, self._paused = [], late_from, 0, []
        self.host = types.SimpleNamespace()

    def add(self, cfg, frames):
        self.sessions.append(object())
        self.builds += 1

    def pause_last(self):
        self._paused.append(self.sessions.pop())

    def resume(self):
        if not self._paused:
            return False
        self.sessions.append(self._paused.pop())
        return True

    @property
    def paused(self):
        return len(self._paused)

    def settle(self, timeout):
        return True


def test_the_steps_stop_at_the_first_late_count_and_bisect_by_pausing(monkeypatch):
    load = _Load(late_from=11)
    held = []

    def window(load_, seconds, progress=None):
        n = len(load_.sessions)
        held.append(n)
        late = int(n >= load_.late_from)
        return {"sessions": n, "seconds": n * 2, "misses": late, "p50_ms": 1.0, "p99_ms": 1.0, "max_ms": 1.0,
                "mean_ms": 1.0, "per_session": [], "gpu_busy_percent": None, "scheduler": {"batches": {}},
                "memory": {}}
    monkeypatch.setattr(ramp_bench, "measure", window)
    knee, steps = ramp_bench.step_through(load, None, [None] * 32, "t", [1, 6, 12, 16, 24, 32], 2.0, bisect=3)
    assert held == [1, 6, 12, 9, 10, 11] and knee == 10
    assert load.builds == 12                  # no session built for the bisection: paused and fed again
    assert sorted(steps) == [1, 6, 9, 10, 11, 12] and steps[12]["misses"] == 1


def test_the_reference_names_the_first_second_that_differs():
    assert reference._compare(["a", "b", "c"], ["a", "b", "c"]) == {"seconds": 3, "identical": True,
                                                                    "first_difference": None}
    assert reference._compare(["a", "x", "c"], ["a", "b", "c"])["first_difference"] == 1
    assert reference._compare(["a", "b"], ["a", "b", "c"]) == {"seconds": 3, "identical": False,
                                                               "first_difference": 2}


def test_each_session_joins_at_its_own_random_moment_from_its_own_offset():
    from engine.host.drive import PacedLoad
    a, b = PacedLoad(host=None, seed=3), PacedLoad(host=None, seed=3)
    try:
        ph = [[x._phases.random() for _ in range(4)] for x in (a, b)]
        assert ph[0] == ph[1] and len(set(ph[0])) == 4                # seeded: the same run twice
    finally:
        a.close()
        b.close()
    inputs = capacity.session_inputs(3, seed=0)
    assert all(len(x) == capacity.CLIP_SECONDS for x in inputs)
    assert not np.array_equal(inputs[1][0], capacity.session_inputs(3, seed=0)[2][0])


def test_a_run_cut_short_keeps_its_windows_in_the_json(tmp_path, one_torch_thread, monkeypatch):
    """The JSON is written as the run goes: cut in the middle of a mode (a call's timeout, simulated by an
    interrupt right after the first window was written), it still holds that window, marked in progress."""
    out = tmp_path / "cap.json"
    write = capacity._write

    def write_then_cut(doc, a):
        write(doc, a)
        if any("steps" in m for m in doc["modes"].values()):
            raise KeyboardInterrupt("the call's timeout")
    monkeypatch.setattr(capacity, "_write", write_then_cut)
    with pytest.raises(KeyboardInterrupt):
        capacity.main(["--device", "cpu", "--size", "tiny", "--tail", "mimi", "--seconds", "1", "--counts", "1,2",
                       "--modes", "optimized", "--json", str(out)])
    m = json.loads(out.read_text())["modes"]["optimized"]
    assert m["in_progress"] is True and m["steps"][0]["sessions"] == 1 and m["steps"][0]["window_s"] == 1
    assert "max_sessions" not in m
