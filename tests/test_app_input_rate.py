"""The app at the session's input rate (pytest-qt, offscreen): a MiniCPM-o 4.5 session is built at
16 kHz (the stock's front end), the microphone opens at 16 kHz where the device takes it, a WAV is resampled
with soxr to 16 kHz one-second frames, echo cancellation and barge-in line up at 16 kHz (the speaker's
reference resampled to the microphone's rate), the journal's input stays 24 kHz, and the app's force-listen
reaches the MiniCPM-o backbone's own Force Listen."""
from __future__ import annotations

import types

import numpy as np

from app import controller as ctl
from app.audio_io import DeviceInfo, FileInput, capture_rate
from app.conversation import controlled_runner
from app.loopback import LoopbackInput
from app.panels import ModelPanel
from app.pump import FramePump
from engine.audio import InputFrames
from engine.session import SessionConfig
from engine.wavio import read_wav, write_wav
from test_app_conversation import SimpleCfg, TalkingRunner
from test_app_fakes import make_window


def test_the_app_builds_a_16k_minicpm_config_and_24k_for_the_others(qtbot):
    panel = ModelPanel(cuda=False)
    qtbot.addWidget(panel)
    for name, rate in (("minicpm-o-4.5", 16000), ("synthetic", 24000)):
        panel.backbone.setCurrentIndex(panel.backbone.findData(name))
        cfg = panel.config(demand_sized=True)
        assert (cfg.backbone, cfg.input_rate) == (name, rate)
        assert cfg.replace(size="tiny", device="cpu").resolved().input_rate == rate


def test_the_microphone_opens_at_the_sessions_rate_where_the_device_takes_it(monkeypatch):
    import app.audio_io as aio
    mic = DeviceInfo(3, "USB mic", "ALSA", 1, 0, 48000)
    asked = []

    def check(device, samplerate, channels, dtype):
        asked.append((device, samplerate))
        if samplerate != 16000:
            raise ValueError("Invalid sample rate")
    monkeypatch.setattr(aio, "sounddevice_module", lambda: types.SimpleNamespace(check_input_settings=check))
    assert capture_rate(mic, 16000) == 16000 and asked == [(3, 16000)]
    assert capture_rate(mic, 22050) == 48000                    # refused: native, the pump resamples
    assert capture_rate(mic, None) == 48000 and capture_rate(mic, 48000) == 48000
    assert aio.DeviceInput(mic, 16000).rate == 16000 and aio.DeviceInput(mic).rate == 48000


def test_a_wav_becomes_16k_frames_with_our_resampler(tmp_path):
    x = (np.random.default_rng(0).standard_normal(3 * 24000) * 0.1).astype(np.float32)
    write_wav(tmp_path / "in.wav", x, 24000)
    src = FileInput(tmp_path / "in.wav")
    frames = []
    pump = FramePump(src, frames.append, rate=16000, echo=False)
    while not src.finished:
        pump.process(src._block(480))
    want = InputFrames(tmp_path / "in.wav", rate=16000, size=16000)
    assert len(frames) >= 2 and all(f.shape == (16000,) for f in frames)
    for k in range(2):                  # soxr's stream, 20 ms at a time, is the one-shot resampler's
        assert np.abs(frames[k] - want[k]).max() < 1e-6, k


def _quiet_room(qtbot, tmp_path, rate: int):
    seconds = 8
    quiet = (np.random.default_rng(0).standard_normal(seconds * 24000) * 1e-3).astype(np.float32)
    write_wav(tmp_path / "voice.wav", quiet, 24000)
    heard = []

    class Heard(TalkingRunner):
        def submit(self, frame):
            heard.append(len(frame))
            super().submit(frame)
    w = make_window(qtbot, tmp_path, Heard)
    w.conversation.echo.setChecked(True)
    src = LoopbackInput(tmp_path / "voice.wav", 120.0, -10.0, seed=1, speed=2.0)
    cfg = SimpleCfg()
    cfg.input_rate = rate
    assert w.start_with(cfg, src, src.sink, max_seconds=seconds)
    qtbot.waitUntil(lambda: w.controller.state == ctl.IDLE, timeout=60000)
    assert w.controller.failure is None and len(w.controller.records) == seconds
    return w, heard


def test_echo_cancellation_lines_up_with_a_16k_microphone(qtbot, tmp_path):
    """A quiet room, the model speaking whenever it hears nothing, echo cancellation on: at 16 kHz (the speaker's
    24 kHz reference brought to the microphone's rate) the model never interrupts itself and its echo is
    suppressed by 20 dB or more, as at 24 kHz; the journal's input is 24 kHz."""
    w, heard = _quiet_room(qtbot, tmp_path, 16000)
    recs = w.controller.records
    assert heard and set(heard) == {16000} and w.controller.pump is None
    assert sum(r.barge_ins for r in recs) == 0 and all(r.echo_cancellation for r in recs)
    spoke = [r.echo_suppression_db for r in recs if r.decision == "speak" and r.echo_suppression_db]
    assert spoke and max(spoke) >= 20.0
    x, rate = read_wav(w.controller.journal.directory / "session_input.wav")
    assert rate == 24000 and x.shape == (len(recs) * 24000,)


def test_force_listen_reaches_the_minicpm_backbone_from_the_app(qtbot, tmp_path, speech_wav, one_torch_thread):
    w = make_window(qtbot, tmp_path, controlled_runner)
    c = w.controller
    cfg = SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=5, cpu_threads=1,
                        input_rate=16000).resolved()
    calls = []
    assert w.start_with(cfg, FileInput(speech_wav, speed=2.0), max_seconds=5)
    qtbot.waitUntil(lambda: c.state == ctl.RUNNING, timeout=60000)
    backbone = c.runner.session.backbone
    inner = backbone.force_listen
    backbone.force_listen = lambda: (calls.append(len(c.runner.session.records)), inner())[1]
    qtbot.waitUntil(lambda: len(c.records) >= 1, timeout=60000)
    c.set_force_listen(True)
    qtbot.waitUntil(lambda: c.state == ctl.IDLE, timeout=120000)
    forced = [r for r in c.records if r.force_listen]
    assert forced and all(r.decision == "listen" for r in forced)
    assert calls and sorted(calls) == [r.index for r in forced]       # each forced second, the backbone's own
    assert len(c.records) == 5 and c.failure is None and not forced[0].index == 0
    x, rate = read_wav(c.journal.directory / "session_input.wav")       # 16 kHz heard, 24 kHz on disk
    assert rate == 24000 and x.shape == (5 * 24000,)
