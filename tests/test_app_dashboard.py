"""The dashboard, offscreen with pytest-qt: output meter, scope, mic-to-speaker delay, toggle
markers, stage statistics, keep-up banner and Stop progress, banners above the plots, small windows, shortcuts,
the scripted Output picker, SPEAK bars of listening seconds, the model panel's engine check."""
from __future__ import annotations


import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app import controller as ctl
from app.audio_io import ENGINE_RATE, DeviceInfo, FileInput, RingBuffer
from app.plots import TOGGLE_COLOUR, TimingPlot
from app.viewmodel import SessionSeries
from engine.session import LiveResult, SessionConfig
from test_app_fakes import SlowRunner, make_window, stop

TINY = SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu", graph_replay=False)
SPEAKER = DeviceInfo(3, "Test speaker", "ALSA", 0, 2, ENGINE_RATE)


class FakeSink:
    """An output device that plays only when the test says (:meth:`play`): until then its queue only grows."""
    label, rate, xruns, latency_s = "Test speaker", ENGINE_RATE, 0, 0.0

    def __init__(self):
        from engine.echo import PlaybackQueue
        self.queue = PlaybackQueue(ENGINE_RATE, 30.0)
        self.played = RingBuffer(ENGINE_RATE * 2)
        self.device = SPEAKER

    def play(self, n: int) -> None:
        """What a device callback does: pop ``n`` samples and keep them as the far end."""
        self.played.write(self.queue.pop(n))

    def start(self):
        pass

    def stop(self):
        pass

    def check(self):
        return None


def _behind(cfg):
    """A SlowRunner whose results say it cannot keep up, with the backlog of the moment."""
    r = SlowRunner(cfg, work_s=0.3)
    put = r.results.put

    def put_with_notice(item):
        put(LiveResult(item.record, item.audio, False, f"cannot keep up: {item.record.backlog} second(s) waiting"))
    r.results.put = put_with_notice
    return r


def test_output_meter_scope_and_delay(qtbot, tmp_path, speech_wav):
    """With a speaker: the output meter shows the speech playing, the scope draws both waveforms,
    and every second gets a mic-to-speaker delay that includes the audio queued ahead of it."""
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=0.05), devices=lambda: ([], [SPEAKER]))
    assert w.summary_row.labels["delay"].text() == "mic→speaker —"
    sink = FakeSink()
    from engine.wavio import write_wav
    hiss = (np.random.default_rng(0).standard_normal(12 * ENGINE_RATE) * 0.02).astype(np.float32)
    write_wav(tmp_path / "hiss.wav", hiss, ENGINE_RATE)      # steady noise: no barge-in flushes the queue
    assert w.start_with(TINY, FileInput(tmp_path / "hiss.wav", speed=4.0), sink)
    qtbot.waitUntil(lambda: len(w.series) >= 4, timeout=20000)
    qtbot.wait(100)
    assert w.device_panel.out_meter.level_db == pytest.approx(-23.0, abs=1.0)    # the runner's 0.1 sine
    delays = [r["mic_to_speaker_ms"] for r in w.series.rows]
    # the audio queued ahead counts, and the queue stays bounded: 4 s of speech a second into a speaker that
    # does not play is dropped down to the playback delay (0.5 s) at every push
    assert all(d > 0 for d in delays) and 400 < delays[-1] < 2600
    assert sink.queue.counts.drop_events >= 1 and sink.queue.queued_s() <= 0.5 + 1.0
    assert w.summary_row.labels["delay"].text() == f"mic→speaker {delays[-1] / 1000:.2f} s"
    assert not (w.scope.speech.getData()[1] + 1.0).any()                        # nothing played: nothing drawn
    sink.play(ENGINE_RATE // 2)                                                 # the device plays 0.5 s
    qtbot.waitUntil(lambda: (w.scope.speech.getData()[1] + 1.0).max() > 0.05, timeout=5000)
    assert np.abs(w.scope.mic.getData()[1]).max() > 0.01                       # both drawn
    stop(qtbot, w)
    assert w.backlog_label.text() == ""
    # the delay is in the records, so exports and replays have it
    assert [r.mic_to_speaker_ms for r in w.controller.records[:len(delays)]] == delays
    from app.replay import load_session
    w.export_to(tmp_path / "export")
    rows = load_session(tmp_path / "export").rows
    assert rows[len(delays) - 1]["mic_to_speaker_ms"] == delays[-1]


def test_no_output_device_in_a_scripted_run(qtbot, tmp_path, speech_wav):
    """A scripted run without a speaker: the Output picker says so and the meter says no playback."""
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=0.01), devices=lambda: ([], [SPEAKER]))
    assert w.device_panel.output.currentData()[0] == "device"                   # the default device first
    assert w.start_with(TINY, FileInput(speech_wav, speed=4.0), None)
    assert w.device_panel.output.currentData() == ("none", None)
    qtbot.waitUntil(lambda: w.device_panel.out_meter.idle_text == "no playback", timeout=10000)
    qtbot.waitUntil(lambda: len(w.series) >= 1, timeout=10000)
    assert w.summary_row.labels["delay"].text().startswith("mic→answer ")     # nothing plays: until ready
    assert not w.model_panel.checking and "applies at the next Start" not in w.model_panel.status.text()
    assert w.controller.records[0].mic_to_speaker_ms == 0.0                  # no speaker: not measured
    w.model_panel.set_values("step-audio2", "synthetic", "tiny", "", "")        # a change during the session
    qtbot.waitUntil(lambda: "applies at the next Start" in w.model_panel.status.text(), timeout=10000)
    stop(qtbot, w)


def test_keep_up_banner_is_live_and_clears_on_stop(qtbot, tmp_path, speech_wav):
    w = make_window(qtbot, tmp_path, _behind)
    top_before = w.timing_plot.mapTo(w, w.timing_plot.rect().topLeft())
    assert w.start_with(TINY, FileInput(speech_wav, speed=8.0))                  # frames pile up
    qtbot.waitUntil(lambda: w.keepup_banner.isVisible(), timeout=10000)
    texts = set()
    qtbot.waitUntil(lambda: texts.add(w.keepup_banner.text()) or len(texts) >= 3, timeout=20000)
    assert all(t.startswith("⚠ cannot keep up:") for t in texts)                # updated, not shown once
    assert not w.message_banner.isVisible()                                     # one banner, not two
    assert w.events.view.toPlainText().count("cannot keep up") == 1            # the log keeps the first
    top = w.timing_plot.mapTo(w, w.timing_plot.rect().topLeft())
    bottom = w.keepup_banner.mapTo(w, w.keepup_banner.rect().bottomLeft())
    assert bottom.y() < top.y() and top.y() > top_before.y()                    # in the layout, never over a plot
    w.controller.stop()
    assert w.state_label.text().startswith("STOPPING: finishing second ")
    qtbot.waitUntil(lambda: w.controller.state == ctl.IDLE, timeout=15000)
    assert not w.keepup_banner.isVisible() and w.backlog_label.text() == ""
    assert w.state_label.text() == "IDLE"


def test_toggle_markers_speak_on_silence_and_skipped_tails(qtbot):
    rows = []
    for i in range(8):
        rows.append(dict(index=i, listen_ms=10.0, think_ms=20.0, speak_ms=400.0, total_ms=430.0, deadline_ms=1000.0,
                         late_ms=0.0, missed=False, demand_sized=i < 3, graph_replay=False, state_bytes=1 << 20,
                         reserved_bytes=0, decision="listen" if i % 2 else "speak", tail_skipped=i == 5))
    series = SessionSeries()
    for r in rows:
        series.add(r)
    plot = TimingPlot()
    qtbot.addWidget(plot)
    plot.update_from(series)
    assert sum(line.isVisible() for line in plot.toggle_lines) == 1
    line = plot.toggle_lines[0]
    assert line.value() == 2.5 and line.label.format == "→ stock-like"
    assert line.pen.color().name() == TOGGLE_COLOUR
    assert plot.bars["speak"].opts["x"].tolist() == [0, 2, 4, 6]
    assert plot.listening_speak.opts["x"].tolist() == [1, 3, 5, 7]
    assert plot.listening_speak.opts["height"].tolist() == [400.0, 400.0, 0.0, 400.0]   # skipped: no bar
    assert "silence tokens" in plot.toolTip()
    series.rows[6]["demand_sized"] = series.rows[7]["demand_sized"] = True  # a second change
    plot.update_from(series)
    assert [ln.value() for ln in plot.toggle_lines if ln.isVisible()] == [2.5, 5.5]


def test_stage_statistics_and_histogram(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, SlowRunner)
    assert w.stats.cells[("total", "p50")].text() == "—"
    chips = {k: lab.text() for k, lab in w.summary_row.labels.items()}
    assert all(t.endswith("—") for t in chips.values()), chips                 # not "p50 0 ms", "state 0 B"
    rng = np.random.default_rng(5)
    for i in range(40):
        t = [float(v) for v in rng.uniform(20, 300, 3)]
        w.on_record(dict(index=i, listen_ms=t[0], think_ms=t[1], speak_ms=t[2], total_ms=sum(t), deadline_ms=1000.0,
                         late_ms=0.0, missed=False, demand_sized=True, graph_replay=False, state_bytes=1 << 20,
                         reserved_bytes=0, decision="speak"))
    think = [r["think_ms"] for r in w.series.rows]
    assert w.stats.cells[("think", "p99")].text() == f"{np.percentile(think, 99):.0f} ms"
    assert w.stats.cells[("total", "p50")].text() == f"{np.percentile(w.series.column('total_ms'), 50):.0f} ms"
    assert int(np.sum(w.stats.bars.opts["height"])) == 40
    assert w.stats.deadline.value() == 1000.0


def test_small_window_and_shortcuts(qtbot, tmp_path, speech_wav):
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=0.01))
    hint = w.minimumSizeHint()
    assert hint.width() <= 900 and hint.height() <= 600
    w.resize(900, 600)
    qtbot.waitUntil(lambda: (w.width(), w.height()) == (900, 600), timeout=3000)
    assert w.start_action.shortcut().toString() == "Ctrl+R" and "Ctrl+R" in w.start_button.toolTip()
    assert w.stop_action.shortcut().toString() == "Ctrl+." and "Ctrl+." in w.stop_button.toolTip()
    assert w.export_action.shortcut().toString() == "Ctrl+E" and "Ctrl+E" in w.export_button.toolTip()
    assert not w.export_action.isEnabled()
    w.device_panel.add_input_file(str(speech_wav))
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=3000)   # shortcuts act in the active window
    qtbot.keyClick(w, Qt.Key_R, Qt.ControlModifier)                       # Start
    qtbot.waitUntil(lambda: w.controller.state in (ctl.STARTING, ctl.RUNNING), timeout=5000)
    qtbot.waitUntil(lambda: len(w.series) >= 1, timeout=10000)
    assert w.export_action.isEnabled()
    qtbot.keyClick(w, Qt.Key_Period, Qt.ControlModifier)                  # Stop
    qtbot.waitUntil(lambda: w.controller.state == ctl.IDLE, timeout=15000)


def test_space_autorepeat_as_release_press_pairs_does_not_flush(qtbot, tmp_path, speech_wav):
    """Some X servers send autorepeat as release+press pairs: only a real key-up ends talking."""
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=0.01))
    w.device_panel.ptt.setChecked(True)
    assert w.start_with(TINY, FileInput(speech_wav))
    pump = w.controller.pump
    calls = []
    real = w.controller.press_talk
    w.controller.press_talk = lambda p: (calls.append(p), real(p))
    qtbot.keyPress(w.start_button, Qt.Key_Space)
    for _ in range(3):
        qtbot.keyRelease(w.start_button, Qt.Key_Space)
        qtbot.keyPress(w.start_button, Qt.Key_Space)
    qtbot.wait(200)
    assert calls == [True] and pump.talking
    qtbot.keyRelease(w.start_button, Qt.Key_Space)
    qtbot.waitUntil(lambda: not pump.talking, timeout=2000)
    assert calls == [True, False]
    stop(qtbot, w)


def test_model_panel_shows_the_engines_verdict(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, SlowRunner)
    panel = w.model_panel
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a model")
    panel.set_values("step-audio2", "synthetic", "tiny", str(junk), "")
    qtbot.waitUntil(lambda: not panel.checking, timeout=10000)
    expected = None
    try:
        panel.config().resolved()
    except ValueError as e:
        expected = str(e)
    assert expected and panel.status.text() == f"✗ {expected}"                # the engine's line, no tick
    panel.set_values("mimi", "synthetic", "released", "", "")
    qtbot.waitUntil(lambda: not panel.checking, timeout=10000)
    assert panel.status.text().startswith("✓ released on cpu") and "cannot keep up" in panel.status.text()
    panel.set_values("mimi", "synthetic", "tiny", "", "")
    qtbot.waitUntil(lambda: not panel.checking, timeout=10000)
    assert "cannot keep up" not in panel.status.text()
