"""Hostile inputs, continued: the app's model-folder checker on the hostile folders (the line the
CLI prints, bounded in time and memory, never a hang), long inputs streamed, a full disk during `run` and
`duplexcadence recover`."""
from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from test_hostile_folders import (ALL_CASES, MB, MESSAGES, RSS_LIMIT, WORK_LIMIT_S, _case_folder, _run_args,
                                  build_minicpm, run_cli, snapshot)

ROOT = Path(__file__).resolve().parents[1]
APP_SCRIPT = r"""
import json, resource, sys, time
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.panels import ModelPanel
panel = ModelPanel(cuda=False)
out = {}
for name, (tail, backbone, ckpt, bckpt) in json.loads(sys.argv[1]).items():
    t0 = time.perf_counter()
    panel.set_values(tail, backbone, "tiny", ckpt, bckpt)
    while panel.checking and time.perf_counter() - t0 < 60:
        app.processEvents()
        time.sleep(0.005)
    out[name] = [panel.status.text(), time.perf_counter() - t0]
print(json.dumps(out))
"""


def _app_check(cases: dict, scratch: Path):
    """The app's panel on every folder of ``cases`` in one subprocess: ({name: (status, seconds)}, peak RSS)."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    out = scratch / f"out-{len(list(scratch.iterdir()))}.json"
    import subprocess
    with open(out, "wb") as f:
        p = subprocess.Popen([sys.executable, "-c", APP_SCRIPT, json.dumps(cases)], cwd=ROOT, stdout=f,
                             stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    assert p.returncode == 0
    return json.loads(out.read_text().strip().splitlines()[-1]), usage.ru_maxrss * 1024


def _panel_values(args: list) -> list:
    """run's arguments for the folder -> the panel's (tail, backbone, checkpoint, backbone checkpoint)."""
    a = dict(zip(args[::2], map(str, args[1::2])))
    return [a.get("--model", "step-audio2"), a.get("--backbone", "synthetic"), a.get("--checkpoint", ""),
            a.get("--backbone-checkpoint", "")]


@pytest.fixture(scope="module")
def minicpm(tmp_path_factory):
    return build_minicpm(tmp_path_factory)


def test_the_app_checker_shows_the_cli_line_bounded(tmp_path, minicpm):
    from engine.session import SessionConfig
    cases, expected, folders = {}, {}, []
    for i, (kind, case) in enumerate(ALL_CASES):
        d = tmp_path / f"c{i}"
        d.mkdir()
        args, folder = _case_folder(d, kind, case, minicpm)
        name = f"{kind}: {case}"
        tail, backbone, ckpt, bckpt = cases[name] = _panel_values(args)
        try:
            SessionConfig(tail=tail, backbone=backbone, size="tiny", checkpoint=ckpt or None,
                          backbone_checkpoint=bckpt or None).resolved()
            expected[name] = None
        except ValueError as e:                # what `duplexcadence run` prints after "error: "
            expected[name] = str(e)
        folders.append(folder)
    before = snapshot(*folders)
    base, base_peak = _app_check({"missing": ["mimi", "synthetic", str(tmp_path / "missing.safetensors"), ""]},
                                 tmp_path / "scratch")
    assert base["missing"][0].startswith("✗") and "does not exist" in base["missing"][0]
    seen, peak = _app_check(cases, tmp_path / "scratch")
    for kind, case in ALL_CASES:
        name = f"{kind}: {case}"
        status, seconds = seen[name]
        assert expected[name] is not None and MESSAGES[(kind, case)] in expected[name]
        assert status == f"✗ {expected[name]}" and "\n" not in status, (name, status)
        assert seconds <= WORK_LIMIT_S, (name, seconds)
    assert peak - base_peak <= RSS_LIMIT, f"{(peak - base_peak) / MB:.0f} MB above the baseline"
    assert snapshot(*folders) == before


def test_a_stalled_check_gives_one_line_within_the_limit(qtbot, monkeypatch):
    """A folder check that never answers (a stalled disk): the panel says so after the limit, and Start waits
    at most the limit, never on the GUI thread's own read of the folder."""
    import app.panels as panels
    from engine.session import SessionConfig
    monkeypatch.setattr(panels, "CHECK_LIMIT_S", 0.5)
    release = __import__("threading").Event()
    real = SessionConfig.resolved

    def stalled(self):
        if self.checkpoint == "/stalled":
            release.wait(30)
        return real(self)
    monkeypatch.setattr(SessionConfig, "resolved", stalled)
    panel = panels.ModelPanel(cuda=False)
    qtbot.addWidget(panel)
    qtbot.waitUntil(lambda: not panel.checking, timeout=10000)
    t0 = time.perf_counter()
    panel.checkpoint.set_path("/stalled")
    qtbot.waitUntil(lambda: not panel.checking, timeout=5000)
    assert "took longer than 0 s" in panel.status.text() or "took longer than 1 s" in panel.status.text()
    assert panel.status.text().startswith("✗") and time.perf_counter() - t0 < 3
    cfg, err = panel.validate()
    assert cfg is None and "took longer" in err
    release.set()                                  # the late answer is dropped
    qtbot.wait(200)
    assert "took longer" in panel.status.text()


# -- long inputs ------------------------------------------------------------------------------------------

def _six_hours(path: Path) -> Path:
    """A 6-hour 24 kHz 16-bit WAV (a sparse file: 1 GB that costs no disk), noise in its first seconds."""
    from engine.wavio import _header
    n = 6 * 3600 * 24000 * 2
    with open(path, "wb") as f:
        f.write(_header(24000, n))
        f.write((0.2 * np.random.default_rng(3).standard_normal(5 * 24000) * 32767).astype("<i2").tobytes())
        f.truncate(44 + n)
    return path


def test_input_frames_stream_a_six_hour_file(tmp_path):
    from engine.audio import InputFrames
    tracemalloc.start()
    frames = InputFrames(_six_hours(tmp_path / "six.wav"))
    got = [frames[k] for k in range(10)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(frames) == 6 * 3600 and peak < 64 * MB
    assert np.abs(got[0]).max() > 0 and not got[9].any()
    again = InputFrames(tmp_path / "six.wav", keep=2)
    assert np.array_equal(again[5], frames[5])
    with pytest.raises(IndexError, match="no longer kept"):
        again[2]
    again.close()
    frames.close()


def test_the_apps_file_input_streams_a_six_hour_file(tmp_path):
    from app.audio_io import FileInput
    from engine.wavio import read_wav
    path = _six_hours(tmp_path / "six.wav")
    tracemalloc.start()
    src = FileInput(path)
    blocks = [src._block(4800) for _ in range(30)]              # 6 s, as the pacing thread asks
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert src.duration_s == 6 * 3600 and not src.finished and peak < 64 * MB
    assert np.array_equal(np.concatenate(blocks)[:5 * 24000], read_wav(path, max_seconds=5)[0])
    short = FileInput(path, max_seconds=0.5)
    assert not short._block(24000)[12000:].any() and short.finished


def test_run_streams_a_six_hour_input_without_seconds(tmp_path):
    """`run` over a 6-hour WAV with no --seconds: RSS stays bounded while it runs; Ctrl-C keeps what was done."""
    wav = _six_hours(tmp_path / "six.wav")
    out = tmp_path / "out"
    out.mkdir()

    def two_seconds_done() -> bool:
        part = [p for p in out.iterdir() if p.name.startswith("log.partial-")]
        rec = part[0] / "session.jsonl" if part else None
        return rec is not None and rec.is_file() and rec.read_text().count("\n") >= 3
    r = run_cli(_run_args(wav, out) + ["--model", "mimi"], tmp_path / "scratch", timeout=240,
                until=two_seconds_done)
    assert r.rc == 130, r.err[-2000:]
    assert "interrupted after" in r.err and (out / "out.wav").is_file()
    assert r.peak < 1500 * MB, f"{r.peak / MB:.0f} MB"


# -- a full disk during run, and recover ------------------------------------------------------------------

def test_a_full_disk_says_what_was_kept_and_recover_finishes_it(tmp_path, monkeypatch, capsys):
    import errno
    from engine.cli import recover as R
    from engine.cli import run as run_cli_mod
    from engine.session import journal as J
    from engine.wavio import read_wav, write_wav
    wav = write_wav(tmp_path / "in.wav", 0.1 * np.random.default_rng(1).standard_normal(5 * 24000), 24000)
    real_append, calls = J.SessionJournal.append, []

    def append(self, rec, heard, said, **kw):
        calls.append(1)
        if len(calls) > 3:
            raise J.ExportError(f"cannot write the session journal in {self.directory}: No space left on device")
        real_append(self, rec, heard, said, **kw)

    def finish(self, *a, **k):
        raise J.ExportError(f"cannot finish the session journal in {self.directory}: {os.strerror(errno.ENOSPC)}")
    monkeypatch.setattr(J.SessionJournal, "append", append)
    monkeypatch.setattr(J.SessionJournal, "finish", finish)
    out, log = tmp_path / "out.wav", tmp_path / "log"
    rc = run_cli_mod.main(["--input", str(wav), "--output", str(out), "--log", str(log), "--model", "mimi",
                           "--size", "tiny", "--device", "cpu", "--quiet"])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "error" in ln]   # after what ran
    assert rc == 1 and len(err) == 1 and err[0].startswith("duplexcadence run: error: "), err
    partial = next(tmp_path.glob("log.partial-*"))
    assert f"the 3 s recorded so far are kept in {partial}" in err[0] and "No space left" in err[0]
    assert f"duplexcadence recover {partial} --log {log} --output {out}" in err[0]
    assert not out.exists() and not log.exists()
    monkeypatch.undo()
    assert R.main([str(tmp_path / "nothing-here")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert R.main([str(tmp_path), "--log", str(log), "--output", str(out)]) == 0    # the parent names the one
    said = capsys.readouterr().out
    assert said.startswith("recovered 3 s (3 records): wrote") and str(out) in said
    assert f"the journal {partial} is kept, marked recovered" in said
    assert read_wav(out)[0].size == 3 * 24000 and len((log / "session.jsonl").read_text().splitlines()) == 3
    assert (log / "session.csv").is_file() and (partial / "session.recovered").is_file()
    assert not (partial / "session.unfinished").exists()


# -- the bounded readers' own costs -----------------------------------------------------------------------

def _walk(text: str) -> tuple:
    """(depth, values) by a character walk that follows strings and escapes: json_shape's reference."""
    depth = deepest = commas = 0
    inside = escaped = False
    for ch in text:
        if inside:
            escaped, inside = (False, inside) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            inside = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
        elif ch == ",":
            commas += 1
    return deepest, commas + 1


def test_json_shape_follows_strings_and_escapes_across_pieces(monkeypatch):
    import random
    from engine import safeload
    rng = random.Random(7)
    leaves = ['"a\\\\"', '"b\\"[,{"', '"\\\\\\"]"', "1", "null", '"x,y"', '"\\\\\\\\\\\\\\\\"']

    def doc(level: int) -> str:
        r = rng.random()
        if level > 5 or r < 0.3:
            return rng.choice(leaves)
        if r < 0.65:
            return "[" + ",".join(doc(level + 1) for _ in range(rng.randint(0, 4))) + "]"
        return "{" + ",".join(f'"k{i}\\\\":' + doc(level + 1) for i in range(rng.randint(0, 4))) + "}"
    for _ in range(200):
        text = doc(0)
        json.loads(text)
        for piece in (1, 2, 3, 7, 1 << 20):              # escapes and strings cut at every place
            monkeypatch.setattr(safeload, "_CHUNK", piece)
            assert safeload.json_shape(text.encode()) == _walk(text), (piece, text)


def test_the_readers_worst_cases_stay_bounded():
    """The largest inputs each reader lets through (or just past its limits) cost seconds and tens of MB."""
    from engine import safeload
    cases = [("json of tiny values", safeload.parse_json, b"[" + b'"a",' * 6_000_000 + b'"a"]'),
             ("yaml of many nodes", safeload.parse_yaml, "a:\n" + "- 1\n" * 200_000),
             ("yaml just under its node limit", safeload.parse_yaml, "a:\n" + "- 1\n" * 4_900),
             ("yaml of long comments", safeload.parse_yaml, ("# " + "x" * 16_000 + "\n") * 62 + "a: 1\n")]
    for name, read, text in cases:
        t0 = time.perf_counter()
        with pytest.raises(safeload.FileCheckError) if "many" in name or "tiny" in name else nullcontext() as e:
            read(text, name)
        assert time.perf_counter() - t0 <= WORK_LIMIT_S, (name, time.perf_counter() - t0)
        assert e is None or "\n" not in str(e.value)
        tracemalloc.start()                              # memory apart: tracing slows the pure-Python scanner
        try:
            read(text, name)
        except safeload.FileCheckError:
            pass
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 200 * MB, (name, peak / MB)


def test_bench_session_reads_only_the_seconds_it_runs_of_a_six_hour_input(tmp_path):
    """`duplexcadence-bench session --input SIX_HOURS --seconds 1`: the input is read as far as the run needs."""
    import subprocess
    wav = _six_hours(tmp_path / "six.wav")
    hwm = tmp_path / "hwm"                   # the child's own peak (VmHWM), not ru_maxrss (kept across exec)
    wrapper = ("import sys\nfrom engine.bench.cli import main\ntry:\n    rc = main(sys.argv[1:])\nfinally:\n"
               f"    open({str(hwm)!r}, 'w').write(next(l.split()[1] for l in open('/proc/self/status') "
               "if l.startswith('VmHWM')))\nsys.exit(rc)\n")
    cmd = [sys.executable, "-c", wrapper, "session", "--input", str(wav), "--seconds", "1",
           "--size", "tiny", "--device", "cpu", "--modes", "stock", "--no-digests", "--quiet",
           "--out", str(tmp_path / "out")]
    with open(tmp_path / "err", "wb") as err:
        p = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL, stderr=err)
    assert p.wait() == 0, (tmp_path / "err").read_text()[-2000:]
    peak = int(hwm.read_text()) * 1024
    assert peak < 1500 * MB, f"{peak / MB:.0f} MB"
