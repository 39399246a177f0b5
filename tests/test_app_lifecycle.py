"""The app's sessions survive: signals, closing the window, dying threads, recovery, long runs, and a
guard against a Qt build that drops references to None while painting (it aborted the app at ~140 s)."""
from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QTimer

from app import controller as ctl
from app import lifecycle
from app.audio_io import FileInput
from app.controller import SessionController
from app.settings import open_qsettings
from app.window import MainWindow
from engine.session import DuplexSession, LiveRunner, SessionConfig
from engine.session.journal import MARKER, SessionJournal, read_records
from engine.wavio import read_wav, write_wav
from test_app_fakes import SlowRunner

ROOT = Path(__file__).resolve().parent.parent
TINY = SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu", graph_replay=False)
RATE = 24000


def noise_wav(path: Path, seconds: float) -> Path:
    x = np.random.default_rng(1).standard_normal(int(seconds * 16000)).astype(np.float32) * 0.1
    return write_wav(path, x, 16000)


def make_window(qtbot, tmp_path, factory) -> MainWindow:
    c = SessionController(factory, journal_root=tmp_path / "journals")
    w = MainWindow(controller=c, settings=open_qsettings(str(tmp_path / "s.ini")), devices=lambda: ([], []),
                   cuda=False)
    qtbot.addWidget(w)
    w.show()
    return w


def run_app(args, tmp_path, **kw) -> subprocess.Popen:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", DUPLEXCADENCE_SETTINGS=str(tmp_path / "settings.ini"),
               DUPLEXCADENCE_SESSIONS=str(tmp_path / "journals"), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "app.main", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def journal_lines(root: Path) -> int:
    return max((len(read_records(p)) for p in root.glob("*/session.jsonl")), default=0)


# -- signals ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_scripted_app_stops_cleanly_on_a_signal(tmp_path, sig):
    """Mid-session: the journal grows each second; the signal stops the session, the output WAV and
    the export hold exactly the processed seconds, one line says so, exit 128 + signal."""
    inp = noise_wav(tmp_path / "in.wav", 30.0)
    out = tmp_path / "out"
    out.mkdir()                                              # an output file's folder must exist
    p = run_app(["--input-file", str(inp), "--model", "mimi", "--size", "tiny", "--device", "cpu",
                 "--output-file", str(out / "reply.wav"), "--export", str(out / "export")], tmp_path)
    try:
        deadline, seen = time.monotonic() + 180, [0]
        while seen[-1] < 3 and time.monotonic() < deadline and p.poll() is None:
            n = journal_lines(tmp_path / "journals" / "scripted")
            if n != seen[-1]:
                seen.append(n)
            time.sleep(0.05)
        assert seen[-1] >= 3 and seen == sorted(seen) and len(seen) >= 3, seen     # grew second by second
        p.send_signal(sig)
        stdout, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 128 + sig, err[-3000:]
    n = len(read_records(out / "export" / "session.jsonl"))
    assert 3 <= n < 30 and f"{n} seconds processed" in stdout
    assert err.strip().splitlines()[-1] == \
        f"duplexcadence: interrupted after {n} s; wrote {out / 'reply.wav'}, {out / 'export'}/"
    assert "Traceback" not in err
    for wav in (out / "reply.wav", out / "export" / "session_input.wav", out / "export" / "session_output.wav"):
        x, rate = read_wav(wav)
        assert rate == RATE and len(x) == n * RATE, wav
    assert len((out / "export" / "session.csv").read_text().splitlines()) == n + 1
    assert not list((tmp_path / "journals" / "scripted").glob(f"*/{MARKER}"))               # the journal finished


def test_interactive_app_quits_on_sigterm(tmp_path):
    """The app as users open it (an unfinished session waiting to be recovered: its question is up):
    SIGTERM quits with 143, no traceback, and the journal it offered stays for the next start."""
    root = tmp_path / "journals"
    j = SessionJournal.create(root / "old", metadata={})
    j.close()                                                  # as a killed process leaves it ...
    marker = json.loads((root / "old" / MARKER).read_text())
    (root / "old" / MARKER).write_text(json.dumps(dict(marker, pid=2 ** 22 + 7)))   # ... with its pid gone
    p = run_app([], tmp_path)
    try:
        time.sleep(15)                                         # started, window and question shown
        assert p.poll() is None, p.communicate()[1][-2000:]
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err and (root / "old" / MARKER).exists()


# -- closing the window -------------------------------------------------------------------------------

@pytest.mark.parametrize("choice", ["export", "discard", "cancel"])
def test_closing_mid_session_asks_and_waits_for_the_threads(qtbot, tmp_path, speech_wav, choice):
    w = make_window(qtbot, tmp_path, LiveRunner)
    asked = []
    w.ask_close = lambda: asked.append(True) or choice
    w.choose_folder = lambda title: str(tmp_path / "export")
    c = w.controller
    assert w.start_with(TINY.resolved(), FileInput(speech_wav))
    qtbot.waitUntil(lambda: len(c.records) >= 2, timeout=60000)
    worker, pump, journal = c.runner._thread, c.pump, c.journal.directory
    w.close()
    assert asked == [True]
    if choice == "cancel":
        assert w.isVisible() and c.state == ctl.RUNNING and worker.is_alive()
        mid = w.export_to(tmp_path / "mid")                  # an export during the session: whole so far
        k = len(read_records(mid["jsonl"]))
        assert k >= 2 and len(mid["csv"].read_text().splitlines()) == k + 1
        assert all(len(read_wav(mid[key])[0]) == k * RATE for key in ("input_wav", "output_wav"))
        w.close_policy = "keep"
        w.close()
    assert not worker.is_alive() and not pump.is_alive() and c.state == ctl.IDLE     # waited for both
    n = len(c.records)
    if choice == "discard":
        assert not journal.exists()
        return
    folder = tmp_path / "export" if choice == "export" else journal
    assert len(read_records(folder / "session.jsonl")) == n and not (folder / MARKER).exists()
    for name in ("session_input.wav", "session_output.wav"):
        assert len(read_wav(folder / name)[0]) == n * RATE


# -- recovery -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("choice", ["recover", "discard", "later"])
def test_window_recovers_an_unfinished_session(qtbot, tmp_path, choice):
    root = tmp_path / "journals"
    j = SessionJournal.create(root / "crashed", metadata={"config": {"tail": "mimi"}})
    s = DuplexSession(TINY)
    s.start()
    rng = np.random.default_rng(2)
    for _ in range(3):
        x = rng.uniform(-0.3, 0.3, RATE).astype(np.float32)
        out, rec = s.process(x)
        j.append(rec, x, out)
    j.close()                                            # no finish: the process "died" here
    marker = json.loads((root / "crashed" / MARKER).read_text())
    (root / "crashed" / MARKER).write_text(json.dumps(dict(marker, pid=2 ** 22 + 7)))
    w = make_window(qtbot, tmp_path, LiveRunner)
    w.ask_recover = lambda jj: choice
    w.choose_folder = lambda title: str(tmp_path / "recovered")
    assert w.offer_recovery(root) == (1 if choice == "recover" else 0)
    if choice == "later":
        assert (root / "crashed" / MARKER).exists() and not (tmp_path / "recovered").exists()
    elif choice == "discard":
        assert not (root / "crashed").exists()
    else:
        d = tmp_path / "recovered"
        assert [r.index for r in read_records(d / "session.jsonl")] == [0, 1, 2]
        assert len((d / "session.csv").read_text().splitlines()) == 4 and json.loads((d / "session.trace.json").read_text())
        assert len(read_wav(d / "session_output.wav")[0]) == 3 * RATE
        assert "recovered 3 s" in w.message_banner.text()


# -- threads that die ---------------------------------------------------------------------------------

class RefusingRunner(SlowRunner):
    """The engine refuses the second frame (like a frame of NaN): the frame pump's submit raises."""

    def __init__(self, cfg):
        super().__init__(cfg, work_s=0.01)
        self.frames = 0

    def submit(self, frame) -> None:
        self.frames += 1
        if self.frames == 2:
            raise ValueError("a session frame holds NaN or infinite samples")
        super().submit(frame)


class BrokenFile(FileInput):
    """A file source whose reading thread dies after 1.5 s."""

    def _block(self, n):
        if self._pos > 1.5 * self.rate:
            raise OSError(5, "Input/output error")
        return super()._block(n)


class FileWithBrokenCallback(FileInput):
    """A file source that, like a PortAudio stream, calls a C callback which raises after 1.5 s (cffi
    reports it as unraisable and carries on)."""

    def __init__(self, path, speed: float = 1.0):
        super().__init__(path, speed)
        import cffi
        self._ffi = cffi.FFI()

        def callback(frames):
            raise RuntimeError("the callback broke")
        self._callback = self._ffi.callback("int(int)", callback, error=1)

    def _block(self, n):
        if self._pos > 1.5 * self.rate:
            self._callback(n)
        return super()._block(n)


def _broken_session(cfg):
    class Broken(DuplexSession):
        def process(self, frame, **kw):
            if len(self.records) == 1:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().process(frame, **kw)
    return LiveRunner(cfg, session_factory=Broken)


@pytest.mark.parametrize("case", ["pump", "audio thread", "audio callback", "engine"])
def test_a_thread_that_dies_stops_the_session_with_one_message(qtbot, tmp_path, speech_wav, monkeypatch, case):
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)       # restored after the test
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    lifecycle.install_thread_guard()
    factory = {"pump": RefusingRunner, "engine": _broken_session}.get(case, lambda cfg: SlowRunner(cfg, work_s=0.01))
    source = {"audio thread": BrokenFile, "audio callback": FileWithBrokenCallback}.get(case, FileInput)(
        speech_wav, speed=2.0)
    w = make_window(qtbot, tmp_path, factory)
    c = w.controller
    assert w.start_with(TINY.resolved(), source)
    qtbot.waitUntil(lambda: c.state == ctl.IDLE, timeout=30000)
    expected = {"pump": f"the input stopped: file {speech_wav}: a session frame holds NaN or infinite samples",
                "audio thread": "BrokenFile stopped: OSError: [Errno 5] Input/output error",
                "audio callback": "an audio callback failed: RuntimeError: the callback broke",
                "engine": "the session stopped: RuntimeError: CUDA error: an illegal memory access was encountered"}
    assert c.failure == expected[case]
    assert w.message_banner.text() == expected[case]
    assert len(c.records) >= 1 and not (c.journal.directory / MARKER).exists()     # what it did is kept


def test_scripted_run_with_nan_input_fails_with_one_line(tmp_path):
    bad = tmp_path / "nan.wav"
    x = np.random.default_rng(0).uniform(-0.2, 0.2, 3 * 16000).astype("<f4")
    x[20000] = np.nan
    data = x.tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 16000 * 4, 4, 32)
    bad.write_bytes(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt "
                    + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)
    p = run_app(["--input-file", str(bad), "--model", "mimi", "--size", "tiny", "--device", "cpu"], tmp_path)
    _, err = p.communicate(timeout=240)
    assert p.returncode not in (0, None), err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and str(bad) in errors[0] and "NaN" in errors[0], err


def test_scripted_run_whose_pump_dies_exits_nonzero_with_one_line(qapp, tmp_path, monkeypatch, capsys):
    """The frame pump dies at the second frame (the engine refuses it): the scripted run stops, keeps
    the first second, prints one error line and exits 1 (it once exited 0 after a traceback)."""
    from app.gui_main import main as gui_main
    submit, seen = LiveRunner.submit, []

    def refuse_second(self, frame):
        seen.append(1)
        if len(seen) == 2:
            raise ValueError("a session frame holds NaN or infinite samples")
        submit(self, frame)
    monkeypatch.setattr(LiveRunner, "submit", refuse_second)
    monkeypatch.setenv("DUPLEXCADENCE_SESSIONS", str(tmp_path / "journals"))
    inp = noise_wav(tmp_path / "in.wav", 4.0)
    code = gui_main(["--input-file", str(inp), "--model", "mimi", "--size", "tiny", "--device", "cpu",
                     "--export", str(tmp_path / "export"), "--settings", str(tmp_path / "s.ini")])
    captured = capsys.readouterr()
    assert code == 1
    errors = [line for line in captured.err.splitlines() if ": error: " in line]
    assert errors == [f"duplexcadence: error: the input stopped: file {inp}: a session frame holds NaN or "
                      "infinite samples"], captured.err
    assert "Traceback" not in captured.err and "1 seconds processed" in captured.out
    assert len(read_records(tmp_path / "export" / "session.jsonl")) == 1


# -- painting must not eat references to None ---------------------------------------------------------

def _feed(w: MainWindow, seconds: int) -> None:
    """``seconds`` of records into the plots (what a session of that length shows)."""
    from engine.session import SecondRecord
    for i in range(seconds):
        w.on_record(SecondRecord(
            index=i, wall_start=1000.0 + i, listen_ms=20.0, think_ms=50.0, speak_ms=80.0 + i % 7,
            total_ms=150.0 + i % 7, deadline_ms=1000.0, late_ms=0.0, missed=False, queue_wait_ms=0.0,
            decision="speak" if i % 3 else "listen", tokens=12, state_bytes=1 << 20, alloc_bytes=0,
            reserved_bytes=0, peak_bytes=0, demand_sized=True, graph_replay=False, tail="mimi",
            backbone="synthetic", input_rms=0.1, output_rms=0.1))


def _paint_for_a_while(w: MainWindow, rounds: int) -> None:
    """Repaint the level meter 5 times and both plots (axes, grids, bars) once per round, offscreen."""
    meter = w.device_panel.meter
    for i in range(rounds):
        for k in range(5):
            w.on_meters({"level_db": -40.0 + 6 * k, "mic_open": True, "xruns": 0, "backlog": 0, "playback_s": 0.0,
                         "output_db": -30.0, "barge_ins": 0, "submitted": i})
            meter.grab()                                         # paints now, offscreen too
        w.timing_plot.grab()
        w.memory_plot.grab()


def _none_lost(qtbot, tmp_path, monkeypatch, leak: bool = False) -> tuple:
    """(references None lost, level-meter paints) over a while of painting; with ``leak`` each meter
    paint drops one reference to None, as the broken drawRect did (given back afterwards)."""
    from app.plots import LevelMeter
    paint, paints, leaking, dropped = LevelMeter.paintEvent, [0], [leak], [0]

    def counted_paint(self, event):
        paint(self, event)
        paints[0] += 1
        if leaking[0]:
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(None))
            dropped[0] += 1
    monkeypatch.setattr(LevelMeter, "paintEvent", counted_paint)
    w = make_window(qtbot, tmp_path, LiveRunner)
    qtbot.waitExposed(w)
    try:
        _feed(w, 130)                                          # the plots full, as after two minutes
        _paint_for_a_while(w, 10)                              # warm up: caches, fonts, first layouts
        gc.collect()
        before, paints[0] = sys.getrefcount(None), 0
        _paint_for_a_while(w, 120)
        gc.collect()
        lost = before - sys.getrefcount(None)
    finally:
        leaking[0] = False
        for _ in range(dropped[0]):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(None))
    return lost, paints[0]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12 on")
def test_painting_keeps_the_references_to_none(qtbot, tmp_path, monkeypatch):
    """A Qt build whose QPainter.drawLine/drawRect drop a reference to None per call (PySide6 6.12.0 on
    Python 3.11) made None's count fall ~900 a second until the interpreter aborted: paint a few
    thousand times (pyqtgraph plots and our level meter) and require None's count not to fall."""
    lost, paints = _none_lost(qtbot, tmp_path, monkeypatch)
    assert paints >= 600
    assert lost <= 50, f"None lost {lost} references over {paints} meter paints"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12 on")
def test_the_none_guard_sees_a_paint_call_that_drops_none(qtbot, tmp_path, monkeypatch):
    """The guard above fails on the fault it guards against."""
    lost, paints = _none_lost(qtbot, tmp_path, monkeypatch, leak=True)
    assert paints >= 600 and lost >= paints - 50 > 50


# -- scripted runs: a failed export, a long session ---------------------------------------------------

def test_failed_export_is_one_line_nonzero_and_leaves_nothing(qapp, tmp_path, monkeypatch, capsys):
    """The disk fills while the export is written: exit 1, one error line, no export folder, no
    temporary folder; the session's journal keeps everything."""
    import errno
    import shutil
    from app.gui_main import main as gui_main
    real_copy = shutil.copyfile

    def disk_full(src, dst, **kw):
        if Path(dst).name == "session_output.wav":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_copy(src, dst, **kw)
    monkeypatch.setattr(shutil, "copyfile", disk_full)
    monkeypatch.setenv("DUPLEXCADENCE_SESSIONS", str(tmp_path / "journals"))
    inp = noise_wav(tmp_path / "in.wav", 2.0)
    code = gui_main(["--input-file", str(inp), "--seconds", "2", "--model", "mimi", "--size", "tiny", "--device",
                     "cpu", "--export", str(tmp_path / "out" / "export"), "--settings", str(tmp_path / "s.ini")])
    err = capsys.readouterr().err
    assert code == 1
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(
        f"duplexcadence: error: export failed: cannot export to {tmp_path / 'out' / 'export'}: "
        "No space left on device"), err
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    kept = list((tmp_path / "journals" / "scripted").glob("*/session.jsonl"))
    assert len(kept) == 1 and len(read_records(kept[0])) == 2


def test_scripted_session_longer_than_200_seconds(tmp_path):
    """205 s through the app at real-time pace (tiny Mimi tail, CPU): exit 0, every second in the
    journal and the export (the app once aborted at ~140 s)."""
    inp = noise_wav(tmp_path / "in.wav", 205.0)
    out = tmp_path / "out"
    out.mkdir()                                              # an output file's folder must exist
    p = run_app(["--input-file", str(inp), "--seconds", "205", "--model", "mimi", "--size", "tiny", "--device", "cpu",
                 "--output-file", str(out / "reply.wav"), "--export", str(out / "export")], tmp_path)
    try:
        stdout, err = p.communicate(timeout=540)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    assert "205 seconds processed" in stdout
    assert [r.index for r in read_records(out / "export" / "session.jsonl")] == list(range(205))
    assert len((out / "export" / "session.csv").read_text().splitlines()) == 206
    for wav in (out / "reply.wav", out / "export" / "session_input.wav", out / "export" / "session_output.wav"):
        x, rate = read_wav(wav)
        assert rate == RATE and len(x) == 205 * RATE, wav
    journals = list((tmp_path / "journals" / "scripted").glob("*/session.jsonl"))
    assert len(journals) == 1 and len(read_records(journals[0])) == 205
    assert not list((tmp_path / "journals" / "scripted").glob(f"*/{MARKER}"))
