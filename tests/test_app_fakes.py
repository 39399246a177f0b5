"""Test doubles for the app tests: a file-backed source that can fail, a scripted LiveRunner.

The product always uses the real :class:`engine.session.LiveRunner`; these doubles only make
failures (a session that cannot start, a device that disappears) happen on cue. They produce the
real ``SecondRecord`` / ``LiveResult`` / ``LiveError`` types.
"""
from __future__ import annotations

import queue
import threading
import time
import types

import numpy as np

from app.audio_io import FileInput
from engine.session import LiveError, LiveResult, SecondRecord


class FailingRunner:
    """A LiveRunner whose session fails to build (the worker reports one LiveError)."""

    def __init__(self, cfg, message: str = "cannot start the session: out of memory"):
        self.cfg, self.message = cfg, message
        self.results: "queue.Queue" = queue.Queue()
        self.session = None
        self.running = False
        self.submitted = 0

    def start(self) -> None:
        threading.Timer(0.05, lambda: self.results.put(LiveError(self.message))).start()

    def submit(self, frame) -> None:
        self.submitted += 1

    def set_toggles(self, toggles) -> None:
        pass

    def backlog(self) -> int:
        return 0

    def stop(self, timeout: float = 5.0) -> None:
        self.running = False


class SlowRunner:
    """A LiveRunner whose every second takes ``work_s`` (late seconds on cue, for the red marks)."""

    def __init__(self, cfg, work_s: float = 1.3):
        self.cfg, self.work_s = cfg, work_s
        self.results: "queue.Queue" = queue.Queue()
        self.session = types.SimpleNamespace(info={"tail_title": "slow test tail", "backbone_title": "none",
                                                   "synthetic": True, "device": "cpu", "size": "tiny"})
        self._frames: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self.running = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.running = True
        self._thread.start()

    def submit(self, frame) -> None:
        self._frames.put((np.asarray(frame, dtype=np.float32), time.perf_counter()))

    def set_toggles(self, toggles) -> None:
        pass

    def backlog(self) -> int:
        return self._frames.qsize()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        k = 0
        while not self._stop.is_set():
            try:
                frame, arrival = self._frames.get(timeout=0.05)
            except queue.Empty:
                continue
            self.results.put(self._second(k, frame, arrival))
            k += 1
        self.running = False

    def _second(self, k: int, frame: np.ndarray, arrival: float) -> LiveResult:
        """Second ``k``'s result for ``frame`` (submitted at ``arrival``, perf_counter): ``work_s`` of sleep."""
        t0 = time.perf_counter()
        wait = (t0 - arrival) * 1000.0
        time.sleep(self.work_s)
        total = (time.perf_counter() - t0) * 1000.0
        late = max(0.0, wait + total - 1000.0)
        rec = SecondRecord(index=k, wall_start=time.time(), listen_ms=total * 0.1, think_ms=total * 0.3,
                           speak_ms=total * 0.6, total_ms=total, deadline_ms=1000.0, late_ms=late,
                           missed=late > 0, queue_wait_ms=wait, decision="speak", tokens=25,
                           state_bytes=1 << 20, alloc_bytes=0, reserved_bytes=0, peak_bytes=0,
                           demand_sized=True, graph_replay=False, tail="slow", backbone="none",
                           input_rms=float(np.sqrt(np.mean(frame ** 2))), output_rms=0.1,
                           backlog=self._frames.qsize())
        audio = (0.1 * np.sin(np.arange(24000) * 2 * np.pi * 220 / 24000)).astype(np.float32)
        return LiveResult(rec, audio)


class VanishingInput(FileInput):
    """A file source that reports a lost device after ``after_s`` seconds, like an unplugged mic."""

    def __init__(self, path, after_s: float, speed: float = 1.0):
        super().__init__(path, speed)
        self.label = "USB mic"
        self.after_s = after_s
        self._t0 = None

    def start(self) -> None:
        self._t0 = time.monotonic()
        super().start()

    def check(self):
        if self.failure is None and self._t0 is not None and time.monotonic() - self._t0 > self.after_s:
            self.failure = "input device 'USB mic' stopped (unplugged?)"
            self.stop()
        return self.failure


def _stop_quietly(w) -> None:
    """Before a test's window closes: stop a session still running (a failed test leaves none behind)."""
    from PySide6.QtWidgets import QApplication

    from app import controller as ctl
    if w.controller.state != ctl.IDLE:
        w.controller.stop()
        deadline = time.monotonic() + 15
        while w.controller.state != ctl.IDLE and time.monotonic() < deadline:
            QApplication.processEvents()
            time.sleep(0.01)


def make_window(qtbot, tmp_path, factory, devices=lambda: ([], [])):
    """A shown MainWindow on ``factory``'s runners, settings in ``tmp_path``; closing never asks."""
    from app.controller import SessionController
    from app.settings import open_qsettings
    from app.window import MainWindow
    w = MainWindow(controller=SessionController(factory), settings=open_qsettings(str(tmp_path / "s.ini")),
                   devices=devices, cuda=False)
    w.close_policy = "keep"              # closing mid-session (teardown) keeps it instead of asking
    qtbot.addWidget(w, before_close_func=_stop_quietly)
    w.show()
    return w


def stop(qtbot, w) -> None:
    """Stop the window's session and wait until it is idle."""
    from app import controller as ctl
    w.controller.stop()
    qtbot.waitUntil(lambda: w.controller.state == ctl.IDLE, timeout=15000)
