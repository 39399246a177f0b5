"""`duplexcadence-bench capacity --backbone minicpm-o-4.5 --stock-loop PYTHON`: the stock loop's
count of sessions in the same run as ours — MiniCPM-o-Demo's own duplex loop, one session (its worker serves one
per GPU), 1 when every second kept the deadline, else 0 — on the CPU at tiny dims; and bad input in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench import capacity_report as C
from engine.bench import stock_loop as SL

ROOT = Path(__file__).resolve().parents[1]
STOCK_PY = ROOT / ".venv-stock" / "bin" / "python"
SECONDS = 4
EAGER = SL.STOCK_LABELS["eager"]

sys.path.insert(0, str(ROOT / "tests"))
import minicpmo45_stock_folder as F  # noqa: E402
import oracles  # noqa: E402


def _capacity(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "engine.bench.capacity", "--tail", "step-audio2", "--backbone",
                           "minicpm-o-4.5", "--size", "tiny", "--device", "cpu", *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=str(ROOT))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    oracles.require(oracles.DEMO, oracles.STOCK_VENV)
    tmp = tmp_path_factory.mktemp("capacity-stock-loop")
    folder = F.write(tmp / "MiniCPM-o-4_5", nudge=(4.0, 1.8))
    out = tmp / "out" / "cap.json"
    r = _capacity("--stock-loop", str(STOCK_PY), "--stock-loop-folder", str(folder), "--seconds", str(SECONDS),
                  "--counts", "1", "--modes", "optimized", "--alone", "0", "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads(out.read_text()), out, folder


def test_the_stock_row_counts_its_one_session(run):
    r, doc, out, _ = run
    s = doc["stock_loop"]
    assert s["label"] == EAGER and s["why"] == SL.ONE_PER_WORKER and "error" not in s
    assert s["seconds"] == SECONDS and s["peak_memory_kind"] == "process peak RSS"
    assert s["max_sessions"] == (1 if s["misses"] == 0 else 0)
    assert 0 < s["p50_total_ms"] <= s["p99_total_ms"] and s["peak_memory_bytes"] > 100 * 2 ** 20
    # what the stock session heard: the first session's input, 16 kHz, the seconds asked for
    import soundfile as sf
    audio, rate = sf.read(str(out.parent / "stock-loop" / "stock-loop-input-16k.wav"), dtype="float32")
    assert rate == SL.RATE and audio.size == SECONDS * SL.RATE and float(abs(audio).max()) > 0.05
    timing = json.loads((out.parent / "stock-loop" / "stock-eager" / "timing.json").read_text())
    assert [x["second"] for x in timing["seconds"]] == list(range(SECONDS)) and timing["compile"] is False
    line = f"stock loop keeps {s['max_sessions']} session(s) on time ({s['misses']} of {SECONDS} s missed"
    assert line in r.stdout


def test_ours_read_the_stock_folder_at_16_khz_and_stay_bit_identical_to_solo(run):
    _, doc, out, folder = run
    opt = doc["modes"]["optimized"]
    assert "error" not in opt, opt
    assert opt["bit_identical_to_solo"] is True and opt["own_steps"]
    assert opt["max_sessions"] in (0, 1) and opt["max_sessions"] == (0 if opt["steps"][0]["misses"] else 1)


def test_the_table_and_markdown_carry_the_stock_row_first(run):
    r, doc, out, _ = run
    md = out.with_suffix(".md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert rows[1].startswith(f"| {EAGER}") and "reference" in rows[1] and "its worker" in rows[1]
    assert rows[2].startswith("| optimized")
    assert SL.ONE_PER_WORKER in md and "stock loop keeps" in md
    assert f"| {EAGER}" in r.stdout and "| its worker" in r.stdout


def test_a_stock_run_that_fails_is_one_line_in_its_row():
    doc = {"modes": {"optimized": {"max_sessions": 3}},
           "stock_loop": {"label": EAGER, "error": "not measured: the stock loop exited 1: boom", "max_sessions": None}}
    assert C.versus_stock(doc) == "stock loop: not measured (not measured: the stock loop exited 1: boom)"
    row = C.stock_row(doc["stock_loop"])
    assert row[0] == EAGER and row[2] == "" and row[-1].endswith("boom")
    doc["stock_loop"] = {"label": EAGER, "max_sessions": 0, "misses": 3, "seconds": 60, "p50_total_ms": 900.0,
                         "p99_total_ms": 1500.0, "peak_memory_bytes": 2 ** 30}
    assert C.versus_stock(doc) == ("stock loop keeps 0 session(s) on time (3 of 60 s missed by its one session); "
                                   "optimized keeps 3")
    assert C.stock_row(doc["stock_loop"])[2:8] == ["900", "1500", "3 of 60", "-", "-", "1024 (peak)"]
    assert C.versus_stock({"modes": {}}) is None


def test_bad_stock_loop_input_is_one_line(tmp_path):
    cases = [
        (["--stock-loop", str(tmp_path / "no-python"), "--stock-loop-folder", str(tmp_path)], "not an executable file"),
        (["--stock-loop", sys.executable], "needs --stock-loop-folder"),
        (["--stock-loop", sys.executable, "--stock-loop-folder", str(tmp_path)], "not a MiniCPM-o 4.5 folder"),
    ]
    for args, words in cases:
        r = _capacity(*args, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, r.stderr
        assert lines[0].startswith("duplexcadence-bench capacity: error: ") and words in lines[0], lines[0]
    r = subprocess.run([sys.executable, "-m", "engine.bench.capacity", "--backbone", "synthetic", "--stock-loop",
                        sys.executable], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert r.returncode == 2 and "use --backbone minicpm-o-4.5" in r.stderr.strip().splitlines()[-1]


def test_one_missed_second_makes_the_stock_count_zero(tmp_path, monkeypatch):
    """The count's rule on the row the harness gives: 0 once its one session misses a second, 1 otherwise."""
    import numpy as np
    seen = {}

    def fake_run(python, folder, wav, out, seed, seconds, device, threads, compile):
        seen.update(seconds=seconds, compile=compile)
        return SL.row_of(ms, ["listen"] * len(ms), 5)

    monkeypatch.setattr(SL, "run_stock", fake_run)
    audio = np.full(3 * SL.RATE - 7, 0.1, np.float32)                  # a short last second still counts
    for ms, count in (([100.0, 1200.0, 50.0], 0), ([100.0, 900.0, 50.0], 1)):
        r = SL.capacity_row(Path(sys.executable), tmp_path, audio, tmp_path / "w", 0, "cpu", 1)
        assert r["max_sessions"] == count and r["misses"] == 1 - count and r["seconds"] == 3
    assert seen == {"seconds": 3, "compile": False}
