"""What a user meets in the window, each promise seen by a test (offscreen, pytest-qt): the wheel changes only a
focused control, the export dialogs take a typed new folder, speech while the model loads is said not heard, the
plots keep their size and their labels apart, the Help menu, readable recent sessions, ALSA's lines in the log."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication

from app.audio_io import DeviceInfo, FileInput
from engine.session import SessionConfig
from test_app_fakes import SlowRunner, make_window

MICS = [DeviceInfo(1, "Built-in mic", "ALSA", 2, 0, 48000), DeviceInfo(2, "USB headset", "ALSA", 1, 0, 48000)]
SPEAKERS = [DeviceInfo(3, "Speakers", "ALSA", 0, 2, 48000)]
TINY = SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu", graph_replay=False)


@pytest.fixture
def no_exit(monkeypatch):
    """A scripted run ends by QApplication.exit(code): here the code is kept (a real exit would quit the
    application the tests share: Qt emits aboutToQuit, and pyqtgraph clears its scenes then)."""
    codes = []
    monkeypatch.setattr(QApplication, "exit", staticmethod(lambda code=0: codes.append(code)))
    return codes


def _wheel(widget, notches: int = -1) -> None:
    """One wheel turn over the middle of ``widget`` (down for negative ``notches``)."""
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    ev = QWheelEvent(pos, widget.mapToGlobal(pos), QPoint(0, 0), QPoint(0, 120 * notches), Qt.NoButton,
                     Qt.NoModifier, Qt.NoScrollPhase, False)
    QApplication.sendEvent(widget, ev)


def test_the_wheel_changes_no_control_it_is_not_focused_on(qtbot, tmp_path, monkeypatch):
    opened = []
    monkeypatch.setattr("app.panels.QFileDialog.getOpenFileName", lambda *a, **k: opened.append(a) or ("", ""))
    w = make_window(qtbot, tmp_path, SlowRunner, devices=lambda: (MICS, SPEAKERS))
    d, cp = w.device_panel, w.conversation
    switched = []
    d.input_changed.connect(lambda: switched.append(d.selected_input()))
    combos = (d.input, d.output, cp.sensitivity, w.model_panel.tail, w.model_panel.size)
    before = [c.currentIndex() for c in combos] + [cp.delay.value()]
    for c in (*combos, cp.delay):
        assert c.focusPolicy() == Qt.StrongFocus
        for notches in (-1, -1, -1, 1):
            _wheel(c, notches)
    assert [c.currentIndex() for c in combos] + [cp.delay.value()] == before
    assert not switched and not opened                  # no microphone switched, no file dialog
    cp.delay.setFocus()
    qtbot.waitUntil(cp.delay.hasFocus, timeout=3000)
    _wheel(cp.delay, 1)                                 # the focused control follows the wheel
    assert cp.delay.value() > before[-1]


def test_closing_and_recover_take_a_typed_new_folder(qtbot, tmp_path, monkeypatch):
    """The close-time Export and Recover ask through the same dialog as Export…: a typed new folder is made."""
    from app.folder_dialog import ExportFolderDialog
    typed = []

    def type_and_accept(dialog):                          # what a user does: types a new name, presses Export
        dialog.selectFile(str(typed[-1]))
        dialog.accept()
        return dialog.result()
    monkeypatch.setattr(ExportFolderDialog, "exec", type_and_accept)
    monkeypatch.setattr("PySide6.QtWidgets.QFileDialog.getExistingDirectory", lambda *a, **k: "")  # Qt's refuses
    w = make_window(qtbot, tmp_path, SlowRunner)
    for title in ("Export the session into…", "Export the recovered session into…"):
        typed.append(tmp_path / f"new {len(typed)}")
        assert w.choose_folder(title) == str(typed[-1])
        assert typed[-1].is_dir()
    typed.append(tmp_path / "new via Export…")
    assert w.choose_export_folder("Export the session into…") == str(typed[-1])


class LoadingRunner(SlowRunner):
    """A runner whose session takes ``build_s`` to be built (the model loading)."""

    def __init__(self, cfg, build_s: float = 1.5):
        super().__init__(cfg, work_s=0.05)
        self._info, self.session = self.session, None
        self.build_s = build_s

    def start(self) -> None:
        import threading
        super().start()
        threading.Timer(self.build_s, lambda: setattr(self, "session", self._info)).start()


class LiveFile(FileInput):
    """A WAV played like a microphone: it runs from the moment it is opened (a device is not deferred)."""
    deferred = False


def test_speech_while_the_model_loads_is_said_not_heard(qtbot, tmp_path, speech_wav):
    from app.controller import RUNNING
    from app.session_audio import UNHEARD
    w = make_window(qtbot, tmp_path, LoadingRunner)
    c = w.controller
    said, events = [], []
    c.message.connect(lambda level, text: said.append((level, text)))
    c.event.connect(lambda kind, text: events.append(text))
    assert w.start_with(TINY, LiveFile(speech_wav))
    qtbot.waitUntil(lambda: c.state == RUNNING, timeout=15000)
    assert said.count(("warning", UNHEARD)) == 1                      # once, as a banner (and on stderr)
    assert w.message_banner.text() == UNHEARD
    lost = [e for e in events if "of speech while the model loaded was not heard" in e]
    assert len(lost) == 1 and float(lost[0].split(" s ")[0]) > 0.2, events


def test_an_engine_toggle_is_in_the_requests_column(qtbot, tmp_path, speech_wav):
    from engine.core.toggles import Toggles
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=0.05))
    c = w.controller
    assert w.start_with(TINY, FileInput(speech_wav))
    qtbot.waitUntil(lambda: len(c.records) >= 1, timeout=15000)
    asked_at = len(c.records)
    c.set_toggles(Toggles(demand_sized=False, graph_replay=False))
    qtbot.waitUntil(lambda: len(c.records) >= asked_at + 2, timeout=15000)
    requests = [r.requests for r in c.records]
    assert "demand-sized state off, graph replay off" in requests[asked_at], requests
    assert sum(1 for q in requests if q) == 1


class LateSession:
    """A session whose every second reports 1.5 s of work (at once): the engine cannot keep up."""

    def __init__(self, cfg):
        self.cfg, self.records, self.last_speech = cfg, [], None
        self.info = {"tail_title": "late tail", "backbone_title": "none", "device": "cpu", "size": "tiny"}

    def start(self) -> None:
        pass

    def process(self, frame, arrival=None, backlog=0):
        import time
        import numpy as np
        from engine.session import SecondRecord
        k = len(self.records)
        rec = SecondRecord(index=k, wall_start=time.time(), listen_ms=500.0, think_ms=500.0, speak_ms=500.0,
                           total_ms=1500.0, deadline_ms=1000.0, late_ms=500.0, missed=True, queue_wait_ms=0.0,
                           decision="listen", tokens=0, state_bytes=1, alloc_bytes=0, reserved_bytes=0, peak_bytes=0,
                           demand_sized=True, graph_replay=False, tail="late", backbone="none", input_rms=0.0,
                           output_rms=0.0, backlog=backlog)
        self.records.append(rec)
        return np.zeros(24000, dtype=np.float32), rec

    def ahead(self, stop=None) -> None:
        pass

    def close(self) -> None:
        pass


def test_cannot_keep_up_is_said_once_on_stderr(qtbot, tmp_path, speech_wav, monkeypatch, capsys, caplog, no_exit):
    """A scripted run prints the engine's "cannot keep up" once: the app's line, and no log line from the runner
    (outside pytest a warning logged goes to stderr too)."""
    import argparse
    from app.conversation import controlled_runner
    from app.gui_main import ScriptedRun
    monkeypatch.setattr("app.conversation.ControlledSession", LateSession)
    w = make_window(qtbot, tmp_path, controlled_runner)
    run = ScriptedRun(w, argparse.Namespace(seconds=3, screenshot=None, output_file=None, export=None))
    assert run.start(TINY, FileInput(speech_wav, speed=4.0), None)
    qtbot.waitUntil(lambda: run._finished, timeout=30000)
    err = capsys.readouterr().err
    assert sum("cannot keep up" in line for line in err.splitlines()) == 1, err
    assert "duplexcadence: warning: cannot keep up" in err
    assert not [r for r in caplog.records if "cannot keep up" in r.getMessage()]
    assert no_exit == [0]


def test_the_echo_readout_is_no_number_without_an_echo_path():
    """With no echo in the microphone (silent, or only the room's noise and the user) the canceller gives no
    suppression figure (it read -152 to +56 dB); with an echo path it does."""
    import numpy as np
    from engine.echo import EchoCanceller
    from engine.echo.room import EchoPath
    from test_echo import far_near, run
    rate = 24000
    far, _ = far_near(seconds=6.0)
    far[2 * rate:3 * rate] = 0.0                          # the speaker quiet for a second (the room's floor)
    far[5 * rate:] = 0.0
    path = EchoPath(90.0, -8.0, 3)
    echo = np.concatenate([path(far[i:i + 480]) for i in range(0, far.size, 480)])
    rng = np.random.default_rng(1)
    noise = (rng.standard_normal(far.size) * 5e-4).astype(np.float32)
    user = np.zeros_like(far)
    user[int(2.2 * rate):int(2.8 * rate)] = 0.1 * rng.standard_normal(int(0.6 * rate))
    for near, heard in ((np.zeros_like(far), False), (noise, False), (noise + user, False), (echo + noise, True),
                        (echo + noise + user, True)):
        aec = EchoCanceller(rate)
        run(aec, far, near.astype(np.float32))
        sup = aec.suppression_db()
        assert (sup is not None and sup >= 20.0) if heard else sup is None, sup


def test_the_echo_readout_drops_its_last_figure_when_cancellation_turns_off(qtbot):
    from app.readouts import ReadoutRow
    r = ReadoutRow()
    qtbot.addWidget(r)
    r.show_row({"echo_cancellation": True, "echo_suppression_db": 31.0}, {})
    assert r.labels["echo"].text() == "echo −31 dB"
    r.show_row({"echo_cancellation": True, "echo_suppression_db": 0.0}, {})     # a listening second: the last reply's
    assert r.labels["echo"].text() == "echo −31 dB"
    r.show_row({"echo_cancellation": False, "echo_suppression_db": 0.0}, {}, echo="off")
    assert r.labels["echo"].text() == "echo off"
    r.show_row({"echo_cancellation": True, "echo_suppression_db": 0.0}, {}, echo="on")
    assert r.labels["echo"].text() == "echo on"


def test_toggle_labels_on_the_timing_plot_never_overlap(qtbot):
    """Toggles flipped second after second: every line is drawn, the labels stack in rows, none covers another."""
    from app.plots import TimingPlot
    from app.viewmodel import SessionSeries
    series = SessionSeries()
    for i in range(40):
        series.add(dict(index=i, listen_ms=10.0, think_ms=20.0, speak_ms=300.0, total_ms=330.0, deadline_ms=1000.0,
                        late_ms=0.0, missed=False, demand_sized=(i in (3, 5, 7) or 9 <= i < 30), graph_replay=i >= 6,
                        force_listen=i >= 8, state_bytes=1 << 20, reserved_bytes=0, decision="speak"))
    plot = TimingPlot()
    qtbot.addWidget(plot)
    plot.resize(900, 300)
    plot.show()
    qtbot.waitExposed(plot)
    plot.update_from(series)
    qtbot.wait(50)
    lines = [line for line in plot.toggle_lines if line.isVisible()]
    assert len(lines) == len(series.mode_changes()) == 8
    shown = [line.label for line in lines if line.label.isVisible()]
    rects = [label.sceneBoundingRect() for label in shown]
    assert len(shown) >= 4 and shown[-1] is lines[-1].label          # the lone change at second 30 has room
    for i, a in enumerate(rects):
        assert all(not a.intersects(b) for b in rects[i + 1:]), [r.getRect() for r in rects]
    assert all(label.toPlainText().startswith("→ ") for label in shown)


def _in_view(w, widget) -> bool:
    """Whether ``widget`` lies whole inside the window, with no scroll area between them."""
    from PySide6.QtCore import QPoint, QRect
    from PySide6.QtWidgets import QScrollArea
    p = widget.parentWidget()
    while p is not None and p is not w:
        if isinstance(p, QScrollArea):
            return False
        p = p.parentWidget()
    top_left = widget.mapTo(w, QPoint(0, 0))
    return w.rect().contains(QRect(top_left, widget.size()))


def test_the_window_at_its_default_and_its_smallest_size(qtbot, tmp_path):
    """Default size: the event log in view without scrolling, the plots unscrolled, the model pickers show their
    whole text. Smallest size (900 × 600): the timing plot keeps its height (the plots scroll instead) and its
    legend stays inside it."""
    from PySide6.QtGui import QFontMetrics
    from app.window import DEFAULT_SIZE, MIN_SIZE
    w = make_window(qtbot, tmp_path, SlowRunner)
    qtbot.waitExposed(w)
    assert (w.width(), w.height()) == DEFAULT_SIZE and w.minimumSize().toTuple() == MIN_SIZE == (900, 600)
    qtbot.wait(50)
    assert _in_view(w, w.tabs) and w.events.view.height() >= 200
    assert w.plots_scroll.verticalScrollBar().maximum() == 0                # nothing to scroll
    for combo in (w.model_panel.tail, w.model_panel.backbone):
        for i in range(combo.count()):
            need = QFontMetrics(combo.font()).horizontalAdvance(combo.itemText(i)) + 30     # the arrow and frame
            assert need <= combo.width(), (combo.itemText(i), need, combo.width())
    w.resize(*MIN_SIZE)
    qtbot.waitUntil(lambda: w.width() == MIN_SIZE[0], timeout=3000)
    qtbot.wait(50)
    assert w.timing_plot.height() >= 250 and w.memory_plot.height() >= 150
    assert _in_view(w, w.tabs) and w.events.view.height() >= 150
    for plot in (w.timing_plot, w.memory_plot):
        legend = plot.legend.mapRectToScene(plot.legend.boundingRect())
        assert legend.right() <= plot.width(), (type(plot).__name__, legend.getRect(), plot.width())


def test_the_scripted_screenshot_shows_the_session_live(qtbot, tmp_path, speech_wav, monkeypatch, no_exit):
    """The screenshot is taken at the last second, with that second's state (it showed FINISHING…)."""
    import argparse
    from app.gui_main import ScriptedRun
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=0.05))
    shown = []
    grab = w.grab
    monkeypatch.setattr(w, "grab", lambda *a: shown.append(w.state_label.text()) or grab(*a))
    shot = tmp_path / "shot.png"
    run = ScriptedRun(w, argparse.Namespace(seconds=3, screenshot=str(shot), output_file=None, export=None))
    assert run.start(TINY, FileInput(speech_wav, speed=4.0), None)
    qtbot.waitUntil(lambda: run._finished, timeout=30000)
    assert shown == ["SPEAKING"] and shot.is_file() and no_exit == [0]           # SlowRunner's seconds all speak


def test_push_to_talk_reads_muted_while_idle(qtbot, tmp_path):
    from app.panels import MIC_MUTED, MIC_OPEN
    w = make_window(qtbot, tmp_path, SlowRunner)
    d = w.device_panel
    assert d.mic_state.text() == MIC_OPEN
    d.ptt.click()
    assert d.mic_state.text() == MIC_MUTED == "mic: muted (hold Space)"
    d.open_mic.click()
    assert d.mic_state.text() == MIC_OPEN


def test_the_help_menu(qtbot, tmp_path, monkeypatch):
    """Help → Keyboard shortcuts, What the plots show, About (with versions), each in a message box."""
    import platform
    from PySide6.QtCore import qVersion
    from app.window_actions import KEYS
    w = make_window(qtbot, tmp_path, SlowRunner)
    menus = [a.text() for a in w.menuBar().actions()]
    assert menus == ["&File", "&Session", "&Help"]
    shown = []
    monkeypatch.setattr(w, "show_help", lambda title, text: shown.append((title, text)))
    for key in ("shortcuts", "plots", "about"):
        w.help_actions[key].trigger()
    (t1, shortcuts), (t2, plots), (t3, about) = shown
    assert (t1, t2, t3) == ("Keyboard shortcuts", "What the plots show", "About DuplexCadence")
    assert all(k in shortcuts for k in KEYS.values()) and "Space — hold to talk" in shortcuts
    assert all(name in plots for name in ("Per-second work", "Sound", "Spectrogram", "State memory", "Events"))
    assert f"Qt: {qVersion()}" in about and f"Python: {platform.python_version()}" in about
    assert "DuplexCadence: 0." in about and "PyTorch: " in about


def test_recent_sessions_read_as_a_date_a_length_and_a_model(qtbot, tmp_path, monkeypatch):
    import json
    import numpy as np
    from app.lifecycle import session_label
    from engine.wavio import write_wav
    monkeypatch.setenv("DUPLEXCADENCE_SESSIONS", str(tmp_path / "s"))
    d = tmp_path / "s" / "20261207-044140-ab12cd34"
    d.mkdir(parents=True)
    (d / "session.jsonl").write_text(json.dumps({"index": 0, "tail": "mimi", "backbone": "synthetic"}) + "\n")
    write_wav(d / "session_output.wav", np.zeros(42 * 24000, np.float32), 24000)
    import time
    when = time.strftime("%a %d %b %Y %H:%M", time.strptime("20261207-044140", "%Y%m%d-%H%M%S")).replace(" 0", " ", 1)
    assert when in ("Mon 7 Dec 2026 04:41", time.strftime("%a 7 %b 2026 04:41", time.strptime("20261207", "%Y%m%d")))
    assert session_label(d) == f"{when} · 42 s · mimi + synthetic"
    w = make_window(qtbot, tmp_path, SlowRunner)
    w.fill_recent_menu()
    first = w.recent_menu.actions()[0]
    assert first.text() == f"{when} · 42 s · mimi + synthetic" and first.toolTip() == str(d)
    assert "ab12cd34" not in first.text()


def test_alsa_lines_are_counted_into_the_event_log_not_printed(qtbot, tmp_path, speech_wav, capfd):
    from app import alsa_log
    log = alsa_log.AlsaLog()
    if alsa_log.probe() is None:
        pytest.skip("no libasound here")
    capfd.readouterr()
    assert log.install()
    try:
        assert alsa_log.probe() < 0                         # ALSA reports the unknown PCM through the handler
    finally:
        log.uninstall()
    assert capfd.readouterr().err == ""                     # nothing on the terminal
    assert log.total == 1 and log.drain() == [("snd_pcm_open_noupdate: Unknown PCM …", 1)]
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=0.05))
    assert w.start_with(TINY, FileInput(speech_wav))
    qtbot.waitUntil(lambda: len(w.controller.records) >= 1, timeout=15000)
    for _ in range(3):                                      # the audio thread's underruns, as ALSA reports them
        alsa_log.ALSA._on_error(b"pcm.c", 8545, b"snd_pcm_recover", 0, b"%s occurred")
    qtbot.waitUntil(lambda: "ALSA: underrun or overrun" in w.events.view.toPlainText(), timeout=5000)
    assert "×3" in w.events.view.toPlainText()
