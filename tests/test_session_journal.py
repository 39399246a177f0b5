"""A session survives: the journal grows every second, `run` finishes cleanly on SIGINT/SIGTERM, an
unfinished journal is recovered, and exports are whole or absent (never two sessions mixed)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.session import ExportError, SecondRecord
from engine.session.recovery import recover
from engine.session.journal import (MARKER, SessionJournal, export_journal, read_records,
                                    unfinished_journals)
from engine.wavio import read_wav, write_wav

ROOT = Path(__file__).resolve().parent.parent
RATE = 24000


def noise_wav(path: Path, seconds: float, seed: int = 0) -> Path:
    x = np.random.default_rng(seed).standard_normal(int(seconds * 16000)).astype(np.float32) * 0.1
    return write_wav(path, x, 16000)


def record(k: int) -> SecondRecord:
    return SecondRecord(index=k, wall_start=1000.0 + k, listen_ms=1.0, think_ms=2.0, speak_ms=3.0, total_ms=6.5,
                        deadline_ms=1000.0, late_ms=0.0, missed=False, queue_wait_ms=0.0, decision="speak",
                        tokens=k, state_bytes=10, alloc_bytes=0, reserved_bytes=0, peak_bytes=0,
                        demand_sized=True, graph_replay=False, tail="mimi", backbone="synthetic",
                        input_rms=0.1, output_rms=0.2)


def second(k: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed * 1000 + k).uniform(-0.5, 0.5, RATE)).astype(np.float32)


def test_journal_is_valid_after_every_second_and_finishes(tmp_path):
    j = SessionJournal.create(tmp_path / "j", metadata={"who": "test"})
    assert (tmp_path / "j" / MARKER).is_file()
    for k in range(3):
        j.append(record(k), second(k, 1), second(k, 2))
        # readable while it grows: k+1 lines and two valid WAVs of k+1 seconds
        assert [r.index for r in read_records(tmp_path / "j" / "session.jsonl")] == list(range(k + 1))
        heard, rate = read_wav(tmp_path / "j" / "session_input.wav")
        assert rate == RATE and len(heard) == (k + 1) * RATE
        assert np.abs(heard[k * RATE:] - second(k, 1)).max() < 1.0 / 32768 + 1e-7
    files = j.finish()
    assert not (tmp_path / "j" / MARKER).exists()
    assert set(files) == {"csv", "jsonl", "trace", "input_wav", "output_wav"}
    assert len(files["csv"].read_text().splitlines()) == 4
    assert json.loads(files["trace"].read_text())["otherData"] == {"who": "test"}
    umask = os.umask(0o022)
    os.umask(umask)
    for p in files.values():
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask             # not 0600
    with pytest.raises(ExportError, match="not empty"):
        SessionJournal.create(tmp_path / "j")


def test_growing_wav_holds_exactly_what_write_wav_writes(tmp_path):
    """Parts of any length, appended: valid after every append, and at the end the same bits as
    ``write_wav`` gives for the whole (16-bit, clipped)."""
    from engine.session.journal import GrowingWav
    rng = np.random.default_rng(11)
    parts = [rng.uniform(-1.2, 1.2, int(n)).astype(np.float32) for n in rng.integers(1, 30000, size=7)]
    g = GrowingWav(tmp_path / "g.wav", 16000)
    for i, p in enumerate(parts):
        g.append(p)
        y, rate = read_wav(tmp_path / "g.wav")
        assert rate == 16000 and len(y) == sum(len(q) for q in parts[:i + 1])
    g.close()
    whole = write_wav(tmp_path / "w.wav", np.concatenate(parts), 16000)
    assert (tmp_path / "g.wav").read_bytes() == whole.read_bytes()


def test_recover_an_unfinished_journal(tmp_path):
    """A process that died mid-second: a torn record line and one second of audio too many."""
    root = tmp_path / "sessions"
    j = SessionJournal.create(root / "a", metadata={"config": {"tail": "mimi"}})
    for k in range(4):
        j.append(record(k), second(k, 3), second(k, 4))
    j._wavs["input"].append(second(9, 3)[:1000])                       # died writing second 4's audio
    j._jsonl.write('{"index": 4, "wall_st')                             # ... and its record
    j._jsonl.flush()
    j.close()
    # the process is gone: replace the marker's pid by one that cannot be running
    marker = json.loads((root / "a" / MARKER).read_text())
    marker["pid"] = 2 ** 22 + 7
    (root / "a" / MARKER).write_text(json.dumps(marker))
    SessionJournal.create(root / "b").finish()                         # a finished one is not offered
    found = unfinished_journals(root)
    assert [f.directory.name for f in found] == ["a"] and found[0].seconds == 4
    assert "4 s recorded" in found[0].describe()
    before = {p.name: p.read_bytes() for p in (root / "a").iterdir()}
    done = recover(found[0].directory, tmp_path / "recovered")
    files = done.files
    assert unfinished_journals(root) == [] and done.folder == tmp_path / "recovered"
    assert [r.index for r in read_records(files["jsonl"])] == [0, 1, 2, 3]
    for key, seed in (("input_wav", 3), ("output_wav", 4)):
        x, rate = read_wav(files[key])
        assert rate == RATE and len(x) == 4 * RATE                    # the torn fifth second is not whole
        assert np.abs(x[3 * RATE:] - second(3, seed)).max() < 1.0 / 32768 + 1e-7
    assert len(files["csv"].read_text().splitlines()) == 5
    after = {p.name: p.read_bytes() for p in (root / "a").iterdir()}
    assert set(after) == set(before) - {MARKER} | {"session.recovered"}   # the journal is only marked
    assert all(after[n] == before[n] for n in before if n != MARKER)
    with pytest.raises(ExportError, match="not an unfinished session journal"):
        recover(found[0].directory)


def test_exports_are_whole_and_never_mix_two_sessions(tmp_path, monkeypatch):
    def journal(name, n, seed):
        j = SessionJournal.create(tmp_path / name)
        for k in range(n):
            j.append(record(k), second(k, seed), second(k, seed + 1))
        j.finish(summary={"seconds": n})
        return j.directory

    a, b = journal("a", 3, 5), journal("b", 2, 7)
    dest = tmp_path / "out" / "export"
    paths = export_journal(a, dest)
    assert len(read_wav(paths["input_wav"])[0]) == 3 * RATE
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o777 & ~umask                   # not mkdtemp's 0700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask for p in paths.values())
    # a second export over the first replaces all of it (no file of the first survives)
    b_files = sorted(p.name for p in b.iterdir())
    (b / "summary.json").unlink()
    export_journal(b, dest)
    assert sorted(p.name for p in dest.iterdir()) == [n for n in b_files if n != "summary.json"]
    assert len(read_records(dest / "session.jsonl")) == 2
    # a folder with the user's own files keeps them; the session files are all of the new session
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    export_journal(a, mine)
    assert (mine / "notes.txt").read_text() == "keep me" and (mine / "summary.json").is_file()
    export_journal(b, mine)
    assert not (mine / "summary.json").exists() and len(read_records(mine / "session.jsonl")) == 2
    # a failure leaves nothing behind and the old export untouched
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match="not a folder"):
        export_journal(a, tmp_path / "file")
    real_copy, copied = shutil.copyfile, []

    def disk_full_at_third(src, dst, **kw):
        copied.append(dst)
        if len(copied) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_copy(src, dst, **kw)
    monkeypatch.setattr(shutil, "copyfile", disk_full_at_third)
    with pytest.raises(ExportError, match="cannot export to .*No space left on device"):
        export_journal(a, dest)
    monkeypatch.undo()
    assert len(read_records(dest / "session.jsonl")) == 2 and (dest / "session_output.wav").is_file()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["export"]        # no temp folder left


# -- `duplexcadence run` in a real process ------------------------------------------------------------

def _run(args, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "app.main", "run", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _lines(folder: Path) -> int:
    try:
        return len(read_records(folder / "session.jsonl"))
    except OSError:
        return 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_run_stops_cleanly_on_a_signal(tmp_path, sig):
    """Stop mid-session: everything so far is written and valid, one line says so, exit 128 + signal."""
    inp = noise_wav(tmp_path / "in.wav", 30.0)
    out, logs = tmp_path / "out.wav", tmp_path / "logs"
    p = _run(["--input", str(inp), "--output", str(out), "--log", str(logs), "--model", "mimi", "--size", "tiny",
              "--device", "cpu", "--realtime", "--quiet"])
    try:
        deadline = time.monotonic() + 120
        seen = []
        while time.monotonic() < deadline:
            partial = sorted(tmp_path.glob("logs.partial-*"))
            n = _lines(partial[0]) if partial else 0
            if not seen or n != seen[-1]:
                seen.append(n)
            if n >= 3:
                break
            time.sleep(0.05)
        assert seen[-1] >= 3, seen
        assert seen == sorted(seen) and len(set(seen)) >= 3             # it grew second by second
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 128 + sig, err
    n = _lines(logs)
    assert 3 <= n < 30
    assert err.strip().splitlines()[-1].startswith(f"duplexcadence run: interrupted after {n} s; wrote {out}")
    assert "Traceback" not in err
    assert not list(tmp_path.glob("logs.partial-*"))
    assert sorted(x.name for x in logs.iterdir()) == ["session.csv", "session.jsonl", "session.trace.json",
                                                      "session_input.wav", "session_output.wav", "speech.npy",
                                                      "summary.json"]
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["seconds"] == n and summary["interrupted"] == signal.Signals(sig).name
    assert len((logs / "session.csv").read_text().splitlines()) == n + 1
    for wav in (out, logs / "session_output.wav", logs / "session_input.wav"):
        x, rate = read_wav(wav)
        assert rate == RATE and len(x) == n * RATE, wav
    heard = read_wav(logs / "session_input.wav")[0]
    assert np.sqrt(np.mean(heard ** 2)) > 0.05                           # the input went in


def test_run_interrupted_while_building_writes_nothing(tmp_path):
    inp = noise_wav(tmp_path / "in.wav", 3.0)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "session.csv").write_text("an earlier run's file\n")
    p = _run(["--input", str(inp), "--output", str(tmp_path / "out.wav"), "--log", str(tmp_path / "logs"),
              "--model", "mimi", "--size", "tiny", "--device", "cpu", "--realtime", "--quiet"])
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("logs.partial-*")) and time.monotonic() < deadline:
            time.sleep(0.01)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    if p.returncode == 130 and "interrupted after 0 s" in err:
        assert not (tmp_path / "out.wav").exists()
        assert (tmp_path / "logs" / "session.csv").read_text() == "an earlier run's file\n"
    else:                                           # the signal came after the first second: still clean
        assert p.returncode == 130 and "interrupted after" in err, err
    assert "Traceback" not in err and not list(tmp_path.glob("logs.partial-*"))


def test_a_signal_inside_a_deferred_block_interrupts_after_it():
    """``StopSignals.deferred``: a signal while a worker thread starts does not break into ``Thread.start`` (CI
    once saw the run above leave the building worker unjoined and the interpreter tear it down with a
    traceback); it raises Interrupted right after the block, once, and only while building."""
    import signal as sig

    from engine.cli.feed import Interrupted, StopSignals
    stop = StopSignals()                                   # not entered: no handler installed, _handle called
    ran = []
    with pytest.raises(Interrupted) as e:
        with stop.deferred():
            stop._handle(sig.SIGINT, None)                 # what the handler does when the signal comes
            ran.append("the rest of the block")
    assert ran == ["the rest of the block"] and e.value.signum == sig.SIGINT and stop.building is False
    with stop.deferred():                                  # no longer building: a later block is not interrupted
        stop._handle(sig.SIGTERM, None)
    quiet = StopSignals()
    with quiet.deferred():
        pass
    assert quiet.building is True and quiet.signum == 0


@pytest.mark.parametrize("after_s", [0.1, 0.4, 0.9])
def test_ctrl_c_while_the_command_starts_is_one_line(tmp_path, after_s):
    """SIGINT while torch and the models still import (before `run` takes signals over): one line, exit 130, no
    KeyboardInterrupt traceback (nor NumPy's broken-install report of one inside its C extension)."""
    inp = noise_wav(tmp_path / "in.wav", 3.0)
    p = _run(["--input", str(inp), "--output", str(tmp_path / "out.wav"), "--log", str(tmp_path / "logs"),
              "--model", "mimi", "--size", "tiny", "--device", "cpu", "--quiet"])
    try:
        time.sleep(after_s)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 130 and len(lines) == 1 and "interrupted" in lines[0], err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "out.wav").exists()
