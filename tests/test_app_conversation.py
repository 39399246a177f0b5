"""Talking without headphones in the app (pytest-qt, offscreen): echo cancellation in the audio path, barge-in
in a blink, the bounded delay, the user's controls from the next second, the event log, the session folder.

The echo tests run the real audio path (pump, AEC3, barge-in detector, bounded playback queue) in a simulated
room (app/loopback.py: the model's speech comes back into the microphone 120 ms later, 10 dB quieter) with
a fast scripted runner that speaks whenever the (cleaned) microphone is quiet, as a voice-activity policy does.
"""
from __future__ import annotations

import os
import time
import types

import numpy as np
import pytest

from app import controller as ctl
from app.audio_io import ENGINE_RATE, DeviceInfo, Playback, RingBuffer, SilentInput
from app.loopback import LoopbackInput, parse_echo
from engine.echo import PlaybackQueue
from engine.session import LiveResult, SecondRecord
from engine.wavio import write_wav
from test_app_fakes import SlowRunner, make_window, stop


def _speech_like(seconds: float, seed: int, level: float = 0.15) -> np.ndarray:
    """Noise in 4 Hz syllables: speech-like for the detectors."""
    n = int(seconds * ENGINE_RATE)
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * np.arange(n) / ENGINE_RATE) ** 2
    return (np.random.default_rng(seed).standard_normal(n) * level * env).astype(np.float32)


class TalkingRunner(SlowRunner):
    """Speaks (speech-like noise) in every second whose input was quiet, listens otherwise: a voice-activity
    policy in 5 ms of work per second."""

    def __init__(self, cfg):
        super().__init__(cfg, work_s=0.005)

    def _second(self, k: int, frame: np.ndarray, arrival: float) -> LiveResult:
        level = float(np.sqrt(np.mean(frame ** 2)))
        speak = level < 0.02
        audio = _speech_like(1.0, seed=k) if speak else np.zeros(ENGINE_RATE, np.float32)
        rec = SecondRecord(index=k, wall_start=time.time(), listen_ms=1, think_ms=2, speak_ms=2, total_ms=5,
                           deadline_ms=1000.0, late_ms=0.0, missed=False, queue_wait_ms=0.0,
                           decision="speak" if speak else "listen", tokens=12, state_bytes=1 << 20,
                           alloc_bytes=0, reserved_bytes=0, peak_bytes=0, demand_sized=True,
                           graph_replay=False, tail="t", backbone="b", input_rms=level, output_rms=0.1,
                           user_speech=not speak)
        return LiveResult(rec, audio)


def _room_session(qtbot, tmp_path, voice: np.ndarray, echo: bool, speed: float = 2.0):
    write_wav(tmp_path / "voice.wav", voice, ENGINE_RATE)
    w = make_window(qtbot, tmp_path, TalkingRunner)
    w.conversation.echo.setChecked(echo)
    src = LoopbackInput(tmp_path / "voice.wav", 120.0, -10.0, seed=1, speed=speed)
    assert w.start_with(SimpleCfg(), src, src.sink, max_seconds=int(len(voice) / ENGINE_RATE))
    qtbot.waitUntil(lambda: w.controller.state == ctl.IDLE, timeout=60000)
    return w, w.controller.records


class SimpleCfg:
    """What start_with needs of a config for a scripted runner."""
    tail, backbone, size, checkpoint, backbone_checkpoint, voice, voice_origin = "t", "b", "tiny", None, "", "", ""
    demand_sized, graph_replay, device, seed, system_prompt = True, False, "cpu", 0, None


def test_without_cancellation_the_model_interrupts_itself_and_with_it_not(qtbot, tmp_path):
    """No user at all (a quiet room): every barge-in is the model's own voice. Off: it interrupts itself;
    on (the default): none, and the echo suppression is in the records while it speaks."""
    quiet = (np.random.default_rng(0).standard_normal(10 * ENGINE_RATE) * 1e-3).astype(np.float32)
    for name in ("off", "on"):
        (tmp_path / name).mkdir()
    _, off = _room_session(qtbot, tmp_path / "off", quiet, echo=False)
    assert sum(r.barge_ins for r in off) > 0 and not any(r.echo_cancellation for r in off)
    w, on = _room_session(qtbot, tmp_path / "on", quiet, echo=True)
    assert sum(r.barge_ins for r in on) == 0
    assert all(r.echo_cancellation for r in on)
    spoke = [r.echo_suppression_db for r in on if r.decision == "speak" and r.echo_suppression_db]
    assert spoke and max(spoke) >= 20.0
    assert w.readouts.labels["echo"].text().startswith("echo −")


def test_barge_in_in_a_blink(qtbot, tmp_path):
    """The user starts talking over the model's speech: playback stops within 300 ms of the onset (the
    detector on 20 ms cleaned frames plus the devices' latency), and the barge-in is in that second's record
    and in the export."""
    voice = np.r_[(np.random.default_rng(1).standard_normal(int(3.4 * ENGINE_RATE)) * 1e-3).astype(np.float32),
                  _speech_like(1.2, seed=9, level=0.4),
                  (np.random.default_rng(2).standard_normal(int(3.4 * ENGINE_RATE)) * 1e-3).astype(np.float32)]
    w, recs = _room_session(qtbot, tmp_path, voice.astype(np.float32), echo=True)
    hits = [r for r in recs if r.barge_ins]
    assert hits, [(r.index, r.decision) for r in recs]
    assert all(0 < r.barge_in_latency_ms <= 300.0 for r in hits)
    assert "barge-in" in w.events.view.toPlainText()
    paths = w.export_to(tmp_path / "export")
    import csv
    with open(paths["csv"]) as f:
        rows = list(csv.DictReader(f))
    assert sum(int(r["barge_ins"]) for r in rows) == sum(r.barge_ins for r in recs)


def test_the_playback_queue_is_bounded():
    """Speech pushed far faster than it plays: the queue holds the delay plus 1 s at most; what was dropped
    is counted as speech."""
    sink = types.SimpleNamespace(rate=48000, queue=PlaybackQueue(48000, 0.5), played=RingBuffer(48000))
    pb = Playback(sink)
    for k in range(6):
        pb.push(_speech_like(1.0, seed=k), k)
        assert pb.queued_s() <= 0.5 + 1.0 + 1e-3
    c = sink.queue.counts
    assert c.drop_events >= 4 and c.dropped_speech_samples > 3 * 48000


def test_the_input_never_builds_a_backlog(qtbot, tmp_path):
    """A live input (not a file) into an engine that takes 1.5 s a second: at most 2 seconds wait; the rest
    are dropped and counted."""
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=1.5))
    assert w.start_with(SimpleCfg(), SilentInput(ENGINE_RATE, speed=4.0))
    seen = []
    qtbot.waitUntil(lambda: seen.append(w.controller.runner.backlog()) or w.controller.input_dropped >= 3,
                    timeout=20000)
    stop(qtbot, w)
    assert max(seen) <= ctl.MAX_INPUT_BACKLOG
    assert w.controller.totals["input_dropped"] >= 1                   # what the readouts show


def test_controls_take_effect_at_the_next_second_and_are_marked(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=0.01))
    src = LoopbackInput(_wav(tmp_path), 100.0, -12.0, speed=4.0)
    assert w.start_with(SimpleCfg(), src, src.sink)
    c = w.controller
    qtbot.waitUntil(lambda: len(c.records) >= 2, timeout=20000)
    w.conversation.sensitivity.setCurrentIndex(w.conversation.sensitivity.findData("high"))
    w.conversation.sensitivity.activated.emit(0)
    w.conversation.delay.setValue(1.5)
    w.conversation.delay.editingFinished.emit()
    n = len(c.records)
    qtbot.waitUntil(lambda: len(c.records) >= n + 3, timeout=20000)
    stop(qtbot, w)
    recs = c.records
    assert recs[0].barge_in_sensitivity == "normal" and recs[0].playback_delay_s == 0.5
    changed = [r for r in recs if r.barge_in_sensitivity == "high"]
    assert changed and changed[0].playback_delay_s == 1.5 and changed[0].index >= n
    asked = [r for r in recs if r.requests]
    assert asked and "interrupt sensitivity high" in asked[0].requests and asked[0].index < changed[0].index
    labels = [line.label.format for line in w.timing_plot.toggle_lines if line.isVisible()]
    assert any("interrupt high" in t and "delay 1.5 s" in t for t in labels), labels
    assert src.sink.queue.delay_s == 1.5 and c.pump is None


def _wav(tmp_path):
    path = tmp_path / "v.wav"
    write_wav(path, _speech_like(6.0, seed=4), ENGINE_RATE)
    return path


def test_force_listen_holds_the_model_to_listening():
    """The engine side: from the next second the model may not start speaking (tiny Mimi + synthetic)."""
    from engine.session import SessionConfig
    from engine.session.controls import Controls, ControlledSession
    s = ControlledSession(SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu",
                                        graph_replay=False).resolved())
    s.start()
    rng = np.random.default_rng(0)
    talk = lambda: (rng.standard_normal(ENGINE_RATE) * 0.1).astype(np.float32)     # noqa: E731
    hush = lambda: (rng.standard_normal(ENGINE_RATE) * 1e-4).astype(np.float32)    # noqa: E731
    free = [s.process(f)[1] for f in (talk(), talk(), hush(), hush())]
    assert any(r.decision == "speak" for r in free) and not any(r.force_listen for r in free)
    s.set_controls(Controls(force_listen=True))
    held = [s.process(f) for f in (talk(), talk(), hush(), hush(), hush())]
    assert all(r.force_listen and r.decision == "listen" for _, r in held)
    assert all(not out.any() for out, _ in held)


def test_event_log_filters_and_collapses(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, SlowRunner)
    for k in range(14):
        w.events.add("late", f"second {k} missed the deadline by {100 + k} ms")
    w.events.add("barge-in", "second 15: 1 barge-in(s), playback silent 120 ms after the onset")
    w.events.add("late", "second 16 missed the deadline by 90 ms")
    lines = w.events.text_lines()
    assert lines[-3].endswith("second 13 missed the deadline by 113 ms  ×14") and "barge-in" in lines[-2]
    w.events.kinds.setCurrentIndex(w.events.kinds.findData("barge-in"))
    assert len(w.events.text_lines()) == 1 and "barge-in" in w.events.text_lines()[0]
    w.events.kinds.setCurrentIndex(0)
    assert len(w.events.text_lines()) == len(lines)


def test_one_line_for_the_fast_paths(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, SlowRunner)
    paths = [f"decoder op {i}: not applicable on cpu" for i in range(14)]
    w.on_info({"tail_title": "T", "backbone_title": "B", "device": "cpu", "size": "tiny", "fast_paths": paths})
    fast = [line for line in w.events.text_lines() if "faster paths" in line or "fast path" in line]
    assert len(fast) == 1 and "0 on" in fast[0] and "14 off or not applicable" in fast[0]


def test_session_folder_kept_by_count_and_age_scripted_apart(qtbot, tmp_path, monkeypatch):
    from app import lifecycle
    monkeypatch.delenv("DUPLEXCADENCE_SESSIONS")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    root = lifecycle.sessions_root()
    assert root == tmp_path / "data" / "DuplexCadence" / "sessions"     # as the README says
    assert lifecycle.sessions_root(scripted=True) == root / "scripted"
    monkeypatch.setenv("DUPLEXCADENCE_SESSIONS", str(tmp_path / "s"))
    root = lifecycle.sessions_root()
    for i in range(lifecycle.KEEP_FINISHED + 3):
        d = root / f"user-{i:02d}"
        d.mkdir(parents=True)
        (d / "session.jsonl").write_text("{}\n")
        os.utime(d, (time.time() - 1000 + i, time.time() - 1000 + i))
    old = root / "ancient"
    old.mkdir()
    (old / "session.jsonl").write_text("{}\n")
    os.utime(old, (time.time() - 40 * 86400, time.time() - 40 * 86400))
    demo = lifecycle.sessions_root(scripted=True) / "demo"
    demo.mkdir(parents=True)
    (demo / "session.jsonl").write_text("{}\n")
    lifecycle.prune_finished(root)
    kept = sorted(p.name for p in root.iterdir() if p.name != "scripted")
    assert len(kept) == lifecycle.KEEP_FINISHED and "user-00" not in kept and "ancient" not in kept
    assert demo.is_dir()                                                  # scripted runs are apart
    recent = lifecycle.recent_sessions()
    assert recent[0] == demo and len(recent) == 10
    w = make_window(qtbot, tmp_path, SlowRunner)
    names = [a.text() for a in w.recent_menu.actions()]
    assert names[0].endswith(" (scripted)") and len(names) == 10
    assert w.recent_menu.actions()[0].toolTip() == str(demo)


def test_small_things(qtbot, tmp_path):
    from app.engine_panel import gui_words
    from app.readouts import ConversationPanel
    from app.window_actions import export_target
    assert parse_echo("120:-10") == (120.0, -10.0)
    with pytest.raises(ValueError, match="DELAY_MS:GAIN_DB"):
        parse_echo("loud")
    assert export_target(f"  {tmp_path}/new/folder ") == f"{tmp_path}/new/folder"
    msg = gui_words("no token (give --token-file FILE or set DUPLEXCADENCE_TOKEN)")
    assert "--" not in msg and "Browse…" in msg
    pulse = DeviceInfo(5, "pulse", "ALSA", 32, 32, 44100)
    assert pulse.label.startswith("PulseAudio / PipeWire (pulse)")
    p = ConversationPanel()
    qtbot.addWidget(p)
    p.show()
    p.show_output("Built-in Audio Analog Stereo")
    assert not p.hint.isVisible()
    p.echo.setChecked(False)
    p.update_hint()
    assert p.hint.isVisible() and "headphones" in p.hint.text()
    p.show_output("USB Headset")
    assert not p.hint.isVisible()


def test_pulse_devices_are_listed_first_with_readable_names(monkeypatch):
    from app import audio_io
    fake = types.SimpleNamespace(
        query_hostapis=lambda: [{"name": "ALSA"}],
        query_devices=lambda: [dict(index=0, name="HDA Intel PCH: ALC (hw:0,0)", hostapi=0, max_input_channels=2,
                                    max_output_channels=2, default_samplerate=48000.0),
                               dict(index=7, name="pulse", hostapi=0, max_input_channels=32,
                                    max_output_channels=32, default_samplerate=44100.0),
                               dict(index=8, name="default", hostapi=0, max_input_channels=32,
                                    max_output_channels=32, default_samplerate=44100.0)])
    monkeypatch.setattr(audio_io, "sounddevice_module", lambda: fake)
    ins, outs = audio_io.list_devices()
    assert [d.name for d in outs] == ["pulse", "default", "HDA Intel PCH: ALC (hw:0,0)"]
    assert outs[1].label.startswith("System default (default)")


def test_dark_mode_radio_buttons_are_visible(qtbot, monkeypatch):
    from PySide6.QtWidgets import QApplication
    from app import theme
    app = QApplication.instance()
    old_palette, old_style, old_sheet = app.palette(), app.style().name(), app.styleSheet()
    monkeypatch.setenv(theme.THEME_ENV, "dark")
    try:
        theme.apply_env_theme(app)
        assert "QRadioButton::indicator" in app.styleSheet() and "#aab0b8" in app.styleSheet()
        monkeypatch.setenv(theme.THEME_ENV, "light")
        theme.apply_env_theme(app)
        assert app.styleSheet() == ""
    finally:
        app.setStyle(old_style)
        app.setPalette(old_palette)
        app.setStyleSheet(old_sheet)


def test_the_playback_delay_is_a_buffer():
    """Playback starts once the delay is queued (buffering is not a gap); a queue that runs dry is one gap,
    whose silence lasts until the buffer is back."""
    from app.loopback import LoopbackOutput
    sink = LoopbackOutput(ENGINE_RATE, 100.0, -10.0)
    sink.queue.set_delay(0.5)
    q, blk = sink.queue, ENGINE_RATE // 50
    q.push(_speech_like(0.3, seed=1))
    for _ in range(10):
        sink.play(blk)
    assert not sink.played.read().any() and q.counts.gap_events == 0      # buffering: silence, no gap
    q.push(_speech_like(0.3, seed=2))
    for _ in range(30):                                                    # 0.6 s: all of it plays
        sink.play(blk)
    assert np.abs(sink.played.read()).max() > 0.05 and q.queued_s() == 0
    for _ in range(10):                                                    # dry: one gap, 0.2 s of silence
        sink.play(blk)
    assert q.counts.gap_events == 1 and q.counts.gap_samples == 10 * blk
    q.push(_speech_like(0.6, seed=3))
    sink.play(blk)
    assert q.counts.gap_events == 1 and np.abs(sink.played.read()[-blk:]).max() > 0.01


def test_export_dialog_accepts_a_typed_new_folder(qtbot, tmp_path):
    from app.window_actions import ExportFolderDialog
    d = ExportFolderDialog(None, "Export the session into…", str(tmp_path))
    qtbot.addWidget(d)
    d.show()
    qtbot.waitExposed(d)
    d.selectFile(str(tmp_path / "new-export"))
    d.accept()
    assert (tmp_path / "new-export").is_dir() and d.result() == 1
    assert d.selectedFiles()[0] == str(tmp_path / "new-export")
