"""Every frame path at the session's input rate: the live runner, `run` (fast, --realtime,
--input-rate), the serve protocol of a remote session, and the app's force-listen reaching the backbone.

A MiniCPM-o 4.5 session takes 16 kHz frames (the stock duplex loop's own input) and `run` gives it them by
default; every other backbone stays at 24 kHz. One second is ``input_rate`` samples; another length is refused
in one line wherever a frame comes in."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from engine.audio import InputFrames, read_wav
from engine.cli.run import main
from engine.session import DuplexSession, LiveError, LiveResult, LiveRunner, SessionConfig
from engine.session.controls import Controls, ControlledSession
from engine.session.input_rate import default_input_rate, journal_copy
from engine.session.records import SecondRecord
from fake_websocket import FakeWs

SHORT = r"a session frame is one second of mono 16 kHz audio \(the session's input_rate\), shape \(16000,\); got"


def _mc(**kw) -> SessionConfig:
    return SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=3, cpu_threads=1, **kw)


def _frames(n: int, rate: int, seed: int = 0):
    rng = np.random.RandomState(seed)
    return [(rng.randn(rate) * 0.1).astype(np.float32) for _ in range(n)]


def _results(runner, n: int, timeout: float = 120.0):
    out = []
    while len(out) < n:
        item = runner.results.get(timeout=timeout)
        assert not isinstance(item, LiveError), item.message
        out.append(item)
    return out


def test_defaults_per_backbone():
    assert default_input_rate("minicpm-o-4.5") == 16000
    assert default_input_rate("synthetic") == 24000 and default_input_rate("moshi") == 24000
    x = np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000).astype(np.float32)
    y = journal_copy(x, 16000)                          # the journal's 24 kHz second
    assert y.shape == (24000,) and np.abs(y[2400:-2400] - np.sin(np.arange(24000) * 2 * np.pi * 440 / 24000)
                                          [2400:-2400]).max() < 1e-3
    assert journal_copy(y, 24000) is not None and np.array_equal(journal_copy(y, 24000), y)


def test_live_runner_takes_16k_frames_and_refuses_other_lengths_in_one_line(one_torch_thread):
    runner = LiveRunner(_mc(input_rate=16000))
    assert runner.input_rate == 16000
    with pytest.raises(ValueError, match=SHORT + r" \(24000,\)$"):
        runner.submit(np.zeros(24000, np.float32))          # refused before it is queued
    runner.start()
    try:
        frames = _frames(2, 16000)
        for f in frames:
            runner.submit(f)
        got = _results(runner, 2)
        assert [r.record.index for r in got] == [0, 1] and all(r.audio.shape == (24000,) for r in got)
        # the runner handed the frames as they are: the session heard these very samples
        assert [r.record.input_rms for r in got] == [float(np.sqrt(np.mean(np.square(f, dtype=np.float64))))
                                                     for f in frames]
    finally:
        runner.stop(timeout=60.0)
        if runner.session is not None:
            runner.session.close()
    plain = LiveRunner(SessionConfig(backbone="synthetic", device="cpu"))
    assert plain.input_rate == 24000
    with pytest.raises(ValueError, match=r"one second of mono 24 kHz audio .* got \(16000,\)$"):
        plain.submit(np.zeros(16000, np.float32))


def _argv(inp, tmp_path, *extra):
    return ["--input", str(inp), "--output", str(tmp_path / "out.wav"), "--log", str(tmp_path / "logs"),
            "--size", "tiny", "--device", "cpu", "--quiet", "--seconds", "2", *extra]


@pytest.mark.parametrize("pace", [(), ("--realtime",)], ids=["fast", "realtime"])
def test_run_feeds_minicpm_16k_frames_by_default(speech_wav, tmp_path, one_torch_thread, pace, monkeypatch):
    heard, process = [], DuplexSession.process

    def spy(self, frame, *a, **kw):
        heard.append(np.array(frame, copy=True))
        return process(self, frame, *a, **kw)
    monkeypatch.setattr(DuplexSession, "process", spy)
    assert main(_argv(speech_wav, tmp_path, "--backbone", "minicpm-o-4.5", *pace)) == 0
    logs = tmp_path / "logs"
    meta = json.loads((logs / "summary.json").read_text())
    assert meta["config"]["input_rate"] == 16000
    want = InputFrames(speech_wav, rate=16000, max_seconds=2, size=16000)   # the WAV at 16 kHz (soxr)
    assert len(heard) == 2 and all(np.array_equal(heard[k], want[k]) for k in range(2))
    x, rate = read_wav(logs / "session_input.wav")                 # the journal stays 24 kHz
    assert rate == 24000 and x.shape == (2 * 24000,)
    out, rate = read_wav(tmp_path / "out.wav")
    assert rate == 24000 and out.shape == (2 * 24000,)


def test_run_input_rate_flag(speech_wav, tmp_path, capsys, one_torch_thread):
    assert main(_argv(speech_wav, tmp_path, "--backbone", "minicpm-o-4.5", "--input-rate", "24000")) == 0
    assert json.loads((tmp_path / "logs" / "summary.json").read_text())["config"]["input_rate"] == 24000
    capsys.readouterr()
    assert main(_argv(speech_wav, tmp_path / "b", "--model", "mimi", "--input-rate", "16000")) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("duplexcadence run: error: input_rate 16000 is not one the synthetic backbone takes; "
                   "choose 24000 Hz")
    with pytest.raises(SystemExit):
        main(_argv(speech_wav, tmp_path / "c", "--input-rate", "16k"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'16k' is not a whole number of Hz (16000 or 24000)" in err[0]
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "default: 16000 for minicpm-o-4.5, 24000 for the other backbones" in " ".join(capsys.readouterr().out.split())


def test_force_listen_control_reaches_a_backbone_that_has_one(one_torch_thread):
    """The app's control on a MiniCPM-o session: the backbone's own force_listen each second it is on (its
    voice activity as heard), the record says forced and the decision is listen."""
    s = ControlledSession(_mc(input_rate=16000))
    s.start()
    try:
        calls = []
        inner = s.backbone.force_listen
        s.backbone.force_listen = lambda: (calls.append(len(s.records)), inner())[1]
        frames = _frames(6, 16000, seed=1)
        free = [s.process(f)[1] for f in frames[:4]]
        assert calls == [] and not any(r.force_listen for r in free)
        s.set_controls(Controls(force_listen=True))
        held = [s.process(f)[1] for f in frames[4:]]
        assert calls == [4, 5]                                       # once per held second, before it runs
        assert all(r.force_listen and r.decision == "listen" for r in held)
        assert held[0].user_speech == bool(s.vad._vad(frames[4]).speech)    # the VAD is left as heard
    finally:
        s.close()


def _serve(host, cfg, messages):
    from engine.serve.pump import Connection
    runner = host.admit(cfg)
    assert runner.ready.wait(120) and runner.session is not None
    ws = FakeWs(messages)

    async def go():
        await Connection(ws, runner, asyncio.Event()).run()
    asyncio.run(go())
    host.release(runner, timeout=60.0)
    return ws


def test_serve_path_with_a_16k_session(one_torch_thread):
    pytest.importorskip("starlette")
    from engine.serve import protocol as P
    from engine.serve.client import RemoteRunner, client_config
    from engine.serve.hosting import SessionHost
    host = SessionHost(_mc(), max_sessions=1)
    try:
        cfg = host.config_for(P.read_hello(P.hello(client_config(_mc(input_rate=16000)))))
        assert cfg.input_rate == 16000
        with pytest.raises(ValueError, match="input_rate 22050 is not one the minicpm-o-4.5 backbone takes"):
            host.config_for({"input_rate": 22050})
        with pytest.raises(ValueError, match="input_rate must be an integer"):
            host.config_for({"input_rate": "16000"})
        frames = _frames(2, 16000, seed=2)
        ws = _serve(host, cfg, [{"type": "websocket.receive", "bytes": P.pack_frame(f)} for f in frames]
                    + [{"type": "websocket.receive", "text": P.encode("stop", drain=True)}])
        results = [P.unpack_result(m) for m in ws.sent if isinstance(m, bytes)]
        assert [r.record.index for r in results] == [0, 1] and ws.closed[0] == P.CLOSE_NORMAL
        ws = _serve(host, cfg, [{"type": "websocket.receive", "bytes": P.pack_frame(np.zeros(24000, np.float32))}])
        assert ws.closed[0] == P.CLOSE_BAD_REQUEST
        assert json.loads(ws.sent[-1])["message"] == (
            "the server stopped the session: a frame is one second of mono 16 kHz float32 audio (the session's "
            "input_rate: 64000 bytes); got 96000 bytes")
    finally:
        host.close_all()
    assert "input_rate" not in client_config(SessionConfig())       # 24 kHz only: left to the server (older ones too)
    assert client_config(_mc())["input_rate"] == 24000               # a MiniCPM-o server may default to 16 kHz
    from engine.cli.serve import build_parser as serve_parser
    from engine.cli.run import make_config
    served = make_config(serve_parser().parse_args(["--backbone", "minicpm-o-4.5", "--size", "tiny",
                                                    "--device", "cpu"]))
    assert served.input_rate == 16000                                # serve's base: the backbone's default
    remote = RemoteRunner(_mc(input_rate=16000), "ws://127.0.0.1:9", "t" * 32)
    with pytest.raises(ValueError, match=SHORT + r" \(24000,\)$"):
        remote.submit(np.zeros(24000, np.float32))


def test_a_24k_protocol_frame_is_unchanged():
    from engine.serve import protocol as P
    x = np.arange(24000, dtype=np.float32) / 24000
    assert np.array_equal(P.unpack_frame(P.pack_frame(x)), x)
    with pytest.raises(P.ProtocolError, match=r"one second of mono 24 kHz float32 audio .*96000 bytes\); got 64000"):
        P.unpack_frame(P.pack_frame(x[:16000]))


def test_records_say_forced_and_a_result_travels(one_torch_thread):
    """A forced record keeps its flag through the protocol (the remote app sees it as the embedded one)."""
    from engine.serve import protocol as P
    rec = SecondRecord(index=0, wall_start=0.0, listen_ms=1.0, think_ms=1.0, speak_ms=1.0, total_ms=3.0,
                       deadline_ms=1000.0, late_ms=0.0, missed=False, queue_wait_ms=0.0, decision="listen",
                       tokens=0, state_bytes=1, alloc_bytes=0, reserved_bytes=0, peak_bytes=0,
                       demand_sized=True, graph_replay=False, tail="t", backbone="b", input_rms=0.0,
                       output_rms=0.0, force_listen=True)
    back = P.unpack_result(P.pack_result(LiveResult(rec, np.zeros(24000, np.float32))))
    assert back.record.force_listen is True
