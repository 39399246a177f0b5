"""Replay and compare exported sessions (File → Open session…), and dark mode (pytest-qt, offscreen)."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from app import theme
from app.controller import SessionController
from app.replay import ReplayError, envelope, load_session
from app.review import CompareWindow, SessionView, compare_line
from app.settings import open_qsettings
from app.window import MainWindow
from engine.session import SecondRecord, export_records
from engine.wavio import write_wav
from test_app_fakes import SlowRunner


def _records(n: int, work_ms: float, demand: bool, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = work_ms * float(rng.uniform(0.8, 1.2))
        out.append(SecondRecord(index=i, wall_start=1000.0 + i, listen_ms=0.1 * t, think_ms=0.3 * t, speak_ms=0.6 * t,
                                total_ms=t, deadline_ms=1000.0, late_ms=max(0.0, t - 1000.0), missed=t > 1000.0,
                                queue_wait_ms=0.0, decision="speak" if i % 3 else "listen", tokens=25,
                                state_bytes=(1 << 20) * (1 if demand else 4), alloc_bytes=0, reserved_bytes=0,
                                peak_bytes=0, demand_sized=demand, graph_replay=False, tail="mimi",
                                backbone="synthetic", input_rms=0.1, output_rms=0.1))
    return out


def _export(folder, n, work_ms, demand, seed=0):
    export_records(_records(n, work_ms, demand, seed), folder,
                   metadata={"tail_title": "Mimi decoder", "backbone_title": "Synthetic", "device": "cpu"})
    rng = np.random.default_rng(seed)
    write_wav(folder / "session_input.wav", (0.1 * rng.standard_normal(n * 24000)).astype(np.float32), 24000)
    write_wav(folder / "session_output.wav", (0.2 * rng.standard_normal(n * 24000)).astype(np.float32), 24000)
    return folder


@pytest.fixture
def window(qtbot, tmp_path):
    w = MainWindow(controller=SessionController(SlowRunner), settings=open_qsettings(str(tmp_path / "s.ini")),
                   devices=lambda: ([], []), cuda=False)
    w.close_policy = "keep"
    qtbot.addWidget(w)
    w.show()
    return w


def test_open_one_session_then_a_second_beside_it(qtbot, tmp_path, window):
    stock = _export(tmp_path / "stock", 12, 900.0, demand=False, seed=1)
    fast = _export(tmp_path / "optimized", 10, 300.0, demand=True, seed=2)
    assert window.open_action.shortcut().toString() == "Ctrl+O"
    assert window.beside_action.shortcut().toString() == "Ctrl+Shift+O"
    replay = window.open_session(stock)
    qtbot.addWidget(replay)
    (view,) = replay.views
    assert len(view.series) == 12 and len(view.timing_plot.bars["listen"].opts["x"]) == 12   # whole session
    assert "Mimi decoder" in view.title.text() and "stock-like" in view.title.text()
    assert view.summary_row.labels["p50"].text() == f"p50 {np.percentile(view.series.column('total_ms'), 50):.0f} ms"
    assert int(np.sum(view.stats.bars.opts["height"])) == 12
    assert np.abs(view.recording.curves[0].getData()[1]).max() > 0.1          # the microphone is drawn
    assert not replay.comparison.isVisible()
    assert window.open_session(fast, beside=True) is replay
    left, right = replay.views
    assert len(right.series) == 10
    assert replay.comparison.isVisible() and "A (left) is " in replay.comparison.text()
    assert "x slower" in replay.comparison.text()
    assert replay.comparison.text() == compare_line(left.series, right.series)
    for name in ("timing_plot", "memory_plot", "recording"):                 # every axis linked
        a, b = getattr(left, name).getPlotItem(), getattr(right, name).getPlotItem()
        assert np.allclose(a.viewRange(), b.viewRange()), name
        a.setXRange(2, 5, padding=0)
        assert b.viewRange()[0] == pytest.approx([2, 5]), name
    assert np.allclose(left.stats.histogram.getPlotItem().viewRange(), right.stats.histogram.getPlotItem().viewRange())
    # an unreadable folder: one error line, both sessions stay
    (tmp_path / "empty").mkdir()
    assert window.open_session(tmp_path / "empty", beside=True) is None
    assert window.message_banner.text() == (f"{tmp_path / 'empty'} is not a session export: it has no "
                                            "session.jsonl or session.csv")
    assert len(replay.views) == 2
    assert window.open_session(stock) is replay and len(replay.views) == 1   # not beside: replaces


def test_reader_falls_back_to_csv_and_names_bad_files(qtbot, tmp_path):
    folder = _export(tmp_path / "s", 5, 400.0, demand=True)
    from_jsonl = load_session(folder).rows
    (folder / "session.jsonl").unlink()
    from_csv = load_session(folder).rows
    assert from_csv == from_jsonl                                               # same types both ways
    assert from_csv[0]["mic_to_speaker_ms"] == 0.0                              # not measured
    view = SessionView(load_session(folder))
    qtbot.addWidget(view)
    assert view.summary_row.labels["delay"].text() == "mic→speaker —"
    assert isinstance(from_csv[0]["missed"], bool) and isinstance(from_csv[0]["state_bytes"], int)
    (folder / "session.jsonl").write_text('{"index": 0}\nnot json\n')
    with pytest.raises(ReplayError, match=r"session.jsonl: line 2 is not JSON"):
        load_session(folder)
    (folder / "session.jsonl").write_text('{"index": 0}\n')
    with pytest.raises(ReplayError, match=r"record 1 lacks listen_ms"):
        load_session(folder)
    with pytest.raises(ReplayError, match="is not a folder"):
        load_session(tmp_path / "nowhere")
    t, lo, hi = envelope((np.r_[np.ones(100), -np.ones(100)].astype(np.float32), 100), columns=4)
    assert t.tolist() == [0.0, 0.5, 1.0, 1.5] and hi.tolist() == [1, 1, -1, -1] and lo.tolist() == [1, 1, -1, -1]


def test_compare_window_alone(qtbot, tmp_path):
    w = CompareWindow()
    qtbot.addWidget(w)
    assert w.open_folder(tmp_path) is None and w.error_banner.text().endswith("no session.jsonl or session.csv")
    assert w.open_folder(_export(tmp_path / "a", 3, 500.0, demand=True)) is not None
    assert not w.error_banner.isVisibleTo(w) and len(w.views) == 1


def test_dark_palette_reaches_the_plots(qtbot, tmp_path, monkeypatch):
    app = QApplication.instance()
    old_palette, old_style = app.palette(), app.style().name()
    monkeypatch.setenv(theme.THEME_ENV, "dark")
    try:
        w = MainWindow(controller=SessionController(SlowRunner), settings=open_qsettings(str(tmp_path / "s.ini")),
                       devices=lambda: ([], []), cuda=False)
        qtbot.addWidget(w)
        assert theme.is_dark(w.palette())
        for plot in (w.timing_plot, w.memory_plot, w.scope, w.stats.histogram):
            assert plot.backgroundBrush().color().lightness() < 80
            assert plot.getPlotItem().getAxis("left").textPen().color().lightness() > 180
        monkeypatch.setenv(theme.THEME_ENV, "light")                 # the palette changes: the plots follow
        theme.apply_env_theme(app)
        qtbot.waitUntil(lambda: w.timing_plot.backgroundBrush().color().lightness() > 200, timeout=3000)
        assert w.palette().color(QPalette.Window).lightness() > 128
    finally:
        app.setStyle(old_style)
        app.setPalette(old_palette)


def test_slower_text_names_the_slower_side():
    from app.review import slower_text
    assert slower_text(100.0, 168.0) == "B (right) is 1.68x slower"
    assert slower_text(300.0, 100.0) == "A (left) is 3.00x slower"
    assert slower_text(100.0, 100.0) == "A and B take the same time"


def test_replay_chips_cover_the_whole_session(qtbot, tmp_path):
    """132 s with 43 misses: "misses 43 of 132 s (whole session)"; mic→speaker from the records that have
    it (one lacks it); the transcript and the audio-path readouts are shown; Play plays the conversation."""
    recs = _records(132, 500.0, demand=True, seed=3)
    for i, r in enumerate(recs):
        r.missed = i % 3 == 0 and i < 129
        r.late_ms = 50.0 if r.missed else 0.0
        r.mic_to_speaker_ms = 0.0 if i == 0 else 1200.0 + i
        r.user_speech = 10 <= i < 14
        r.text = "hello there" if i == 20 else ""
        r.barge_ins, r.barge_in_latency_ms = (1, 180.0) if i == 30 else (0, 0.0)
        r.playback_gaps, r.playback_gap_ms = (2, 40.0) if i == 40 else (0, 0.0)
    export_records(recs, tmp_path / "s", metadata={"device": "cpu"})
    rate = 24000
    write_wav(tmp_path / "s" / "session_input.wav", np.full(3 * rate, 0.1, np.float32), rate)
    write_wav(tmp_path / "s" / "session_output.wav", np.full(3 * rate, 0.2, np.float32), rate)
    view = SessionView(load_session(tmp_path / "s"))
    qtbot.addWidget(view)
    labels = view.summary_row.labels
    assert labels["misses"].text() == "misses 43 of 132 s (whole session)"
    assert labels["delay"].text() == f"mic→speaker {np.median([1200.0 + i for i in range(1, 132)]) / 1000:.2f} s (median)"
    text = view.transcript.toPlainText()
    assert "[10–13 s] user speaking" in text and "[20 s] model: hello there" in text and "[1 s] model: —" in text
    assert view.readouts.labels["barge_in"].text() == "barge-in 180 ms (1)"
    assert view.readouts.labels["gaps"].text().endswith("2 in all")
    from app.replay_audio import ReplayPlayer, conversation
    mix, r = conversation(view.session)
    assert r == rate and len(mix) == 4 * rate
    assert mix[:rate].max() == pytest.approx(0.1, abs=1e-3) and mix[rate:3 * rate].max() == pytest.approx(0.3, abs=1e-3)

    class Stream:                                    # an output device that plays at once
        def __init__(self, rate, callback):
            self.callback, self.closed = callback, False

        def start(self):
            out = np.zeros((len(mix), 1), np.float32)
            self.callback(out, len(mix), None, None)
            self.played = out[:, 0]

        def close(self, ignore_errors=True):
            self.closed = True
    streams = []
    player = ReplayPlayer(view.session, open_stream=lambda rate, cb: streams.append(Stream(rate, cb)) or streams[-1])
    qtbot.addWidget(player)
    assert player.play() and player.text() == "■ Stop"
    assert np.array_equal(streams[0].played, mix)    # exactly the conversation, from its start
    qtbot.waitUntil(lambda: not player.playing, timeout=3000)      # at its end it stops by itself
    assert streams[0].closed and player.text() == "▶ Play"


def test_a_run_log_names_its_model_in_the_replay(tmp_path, speech_wav):
    """A `duplexcadence run` log: the run writes the session's info, and a log that holds only the run's config
    (or nothing but records) is still shown with its model."""
    import json
    from engine.cli.run import main as run_main
    assert run_main(["--input", str(speech_wav), "--output", str(tmp_path / "o.wav"), "--log", str(tmp_path / "log"),
                     "--model", "mimi", "--size", "tiny", "--device", "cpu", "--seconds", "2", "--quiet"]) == 0
    s = load_session(tmp_path / "log")
    assert s.info["tail_title"].startswith("Mimi decoder") and s.info["device"] == "cpu"
    assert "Mimi decoder" in s.title and " on cpu" in s.title
    trace = tmp_path / "log" / "session.trace.json"
    doc = json.loads(trace.read_text())
    doc["otherData"] = {"config": {"tail": "mimi", "backbone": "synthetic", "device": "cpu", "size": "tiny"}}
    trace.write_text(json.dumps(doc))                        # what older run logs hold
    s = load_session(tmp_path / "log")
    assert "Mimi decoder" in s.title and s.info["backbone_title"] and " on cpu" in s.title
    trace.unlink()                                           # records alone
    assert "Mimi decoder" in load_session(tmp_path / "log").title
