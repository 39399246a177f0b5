"""Audio plumbing without a sound card or Qt: ring buffers, resampling, framing, WAV, file source, pump."""
from __future__ import annotations

import builtins
import struct
import time
import types

import numpy as np
import pytest

from app import audio_io
from app.audio_io import (ENGINE_RATE, AudioUnavailable, DeviceInfo, DeviceInput, DeviceOutput, FileInput,
                          FrameAssembler, Playback, RingBuffer, StreamResampler, find_device)
from app.pump import SILENCE_DB, FramePump, level_db
from engine.wavio import WavError, read_wav, write_wav

RNG = np.random.default_rng(1234)


def noise(n: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(n) * scale).astype(np.float32)


# -- ring buffer ---------------------------------------------------------------------------------

def test_ring_buffer_is_a_fifo_across_wraparound():
    ring = RingBuffer(1000)
    sent, got = [], []
    for n in RNG.integers(1, 400, size=60):
        x = noise(int(n))
        assert ring.write(x) == 0
        sent.append(x)
        got.append(ring.read(int(RNG.integers(0, 500))))
        if len(ring) > 600:                       # keep it from overflowing in this test
            got.append(ring.read())
    got.append(ring.read())
    assert ring.dropped == 0
    assert np.array_equal(np.concatenate(got), np.concatenate(sent))


def test_ring_buffer_drops_oldest_when_full_and_counts():
    ring = RingBuffer(100)
    a, b = noise(80), noise(50)
    assert ring.write(a) == 0
    assert ring.write(b) == 30
    assert ring.dropped == 30 and ring.overflows == 1
    assert np.array_equal(ring.read(), np.concatenate([a[30:], b]))
    big = noise(250)
    ring.write(big)
    assert np.array_equal(ring.read(), big[-100:])


def test_ring_buffer_read_into_and_clear():
    ring = RingBuffer(64)
    x = noise(40)
    ring.write(x)
    out = np.full(50, 9.0, dtype=np.float32)
    assert ring.read_into(out) == 40
    assert np.array_equal(out[:40], x)
    ring.write(noise(10))
    assert ring.clear() == 10 and len(ring) == 0
    assert not ring.wait(0.01)


# -- resampling and framing ----------------------------------------------------------------------

def test_stream_resampler_chunked_keeps_a_tone():
    rate, f = 44100, 440.0
    x = (0.5 * np.sin(2 * np.pi * f * np.arange(rate * 2) / rate)).astype(np.float32)
    rs = StreamResampler(rate, ENGINE_RATE)
    parts, i = [], 0
    while i < len(x):
        n = int(RNG.integers(1, 2000))
        parts.append(rs.process(x[i:i + n]))
        i += n
    parts.append(rs.flush())
    y = np.concatenate(parts)
    assert abs(len(y) - 2 * ENGINE_RATE) <= 2
    ref = 0.5 * np.sin(2 * np.pi * f * np.arange(len(y)) / ENGINE_RATE)
    mid = slice(2000, len(y) - 2000)                  # skip the filter's start and end
    corr = np.corrcoef(y[mid], ref[mid])[0, 1]
    assert corr > 0.99, corr


def test_stream_resampler_same_rate_is_identity():
    x = noise(1234)
    assert np.array_equal(StreamResampler(24000, 24000).process(x), x)


def test_frame_assembler_cuts_exact_frames():
    asm = FrameAssembler(1000)
    x = noise(7654)
    frames, i = [], 0
    while i < len(x):
        n = int(RNG.integers(1, 900))
        frames += asm.push(x[i:i + n])
        i += n
    assert len(frames) == 7 and asm.pending == 654
    assert np.array_equal(np.concatenate(frames), x[:7000])


# -- WAV files ---------------------------------------------------------------------------------------

def _wav_bytes(tag: int, channels: int, rate: int, bits: int, payload: bytes) -> bytes:
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * channels * bits // 8, channels * bits // 8, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_wav_roundtrip_16_bit(tmp_path):
    x = np.clip(noise(5000), -0.99, 0.99)           # full scale +1.0 is not representable in PCM
    write_wav(tmp_path / "a.wav", x, 16000)
    y, rate = read_wav(tmp_path / "a.wav")
    assert rate == 16000 and y.shape == x.shape
    assert np.max(np.abs(y - x)) <= 0.5 / 32768 + 1e-7


def test_wav_reads_float_stereo_and_24_bit(tmp_path):
    st = noise(2 * 300).reshape(300, 2)
    (tmp_path / "f.wav").write_bytes(_wav_bytes(3, 2, 48000, 32, st.astype("<f4").tobytes()))
    y, rate = read_wav(tmp_path / "f.wav")
    assert rate == 48000 and np.allclose(y, st.mean(axis=1))
    v = RNG.integers(-(1 << 23), 1 << 23, size=200)
    raw = b"".join(int(s).to_bytes(3, "little", signed=True) for s in v)
    (tmp_path / "p.wav").write_bytes(_wav_bytes(1, 1, 22050, 24, raw))
    y, rate = read_wav(tmp_path / "p.wav")
    assert rate == 22050 and np.array_equal(y, (v / float(1 << 23)).astype(np.float32))


def test_wav_errors_name_the_problem(tmp_path):
    with pytest.raises(WavError, match="cannot read .*nope.wav"):
        read_wav(tmp_path / "nope.wav")
    (tmp_path / "t.wav").write_text("hello, not audio")
    with pytest.raises(WavError, match="not a WAV file"):
        read_wav(tmp_path / "t.wav")
    (tmp_path / "u.wav").write_bytes(_wav_bytes(85, 1, 8000, 16, b"\0" * 10))
    with pytest.raises(WavError, match="unsupported WAV encoding"):
        read_wav(tmp_path / "u.wav")
    with pytest.raises(WavError, match="cannot write"):          # a folder that cannot exist
        write_wav(tmp_path / "t.wav" / "x.wav", noise(10), 8000)
    write_wav(tmp_path / "new-dir" / "x.wav", noise(10), 8000)  # missing folders are made
    assert read_wav(tmp_path / "new-dir" / "x.wav")[1] == 8000


def test_write_wav_keeps_channels_interleaved(tmp_path):
    x = np.stack([np.full(100, 0.5, np.float32), np.full(100, -0.25, np.float32)], axis=1)
    write_wav(tmp_path / "st.wav", x, 16000)
    y, rate = read_wav(tmp_path / "st.wav")                     # mixed down on reading
    assert rate == 16000 and y.shape == (100,) and np.allclose(y, 0.125, atol=1e-4)


# -- sources, sinks, devices ---------------------------------------------------------------------------

def test_file_input_plays_the_file_then_silence(tmp_path):
    x = np.clip(noise(4800), -1, 1)
    write_wav(tmp_path / "in.wav", x, 48000)
    src = FileInput(tmp_path / "in.wav", speed=20.0)     # 0.1 s of audio in ~5 ms
    src.start()
    deadline = time.monotonic() + 5
    while len(src.ring) < 9600 and time.monotonic() < deadline:
        time.sleep(0.01)
    src.stop()
    assert src.finished and src.rate == 48000
    got = src.ring.read()
    expect, _ = read_wav(tmp_path / "in.wav")
    assert np.array_equal(got[:4800], expect)
    assert not got[4800:].any()


def test_device_callbacks_only_copy(monkeypatch):
    dev = DeviceInfo(3, "Test Mic", "ALSA", 2, 2, 44100)
    src, sink = DeviceInput(dev), DeviceOutput(dev)
    ok = types.SimpleNamespace(input_overflow=False, output_underflow=False)
    bad = types.SimpleNamespace(input_overflow=True, output_underflow=True)
    block = noise(256).reshape(-1, 1)
    src._callback(block, 256, None, ok)
    src._callback(block, 256, None, bad)
    assert src.xruns == 1 and np.array_equal(src.ring.read(), np.concatenate([block[:, 0]] * 2))
    sink.queue.push(block[:100, 0])
    out = np.full((256, 1), 7.0, dtype=np.float32)
    sink._callback(out, 256, None, bad)
    assert sink.xruns == 1
    assert np.array_equal(out[:100, 0], block[:100, 0]) and not out[100:].any()
    assert np.array_equal(sink.played.read(), out[:, 0])          # the far end: exactly what was played


def test_a_stream_that_will_not_close_is_left_behind_in_one_line(monkeypatch, capsys):
    """A vanished sound server can leave PortAudio's close waiting for ever: stop() gives up after
    CLOSE_WAIT_S, says so in one line, and keeps PortAudio's exit handler from waiting on it at exit."""
    import atexit
    import sys
    import threading
    release, closed = threading.Event(), []

    class Stuck:
        def close(self, ignore_errors=False):
            release.wait()                                  # the dead server: never answers (until the test ends)
            closed.append(ignore_errors)

    class Quick:
        def close(self, ignore_errors=False):
            closed.append(ignore_errors)

    fake_sd = types.SimpleNamespace(_exit_handler=lambda: None)
    unregistered = []
    monkeypatch.setattr(atexit, "unregister", unregistered.append)
    monkeypatch.setitem(sys.modules, "sounddevice", fake_sd)
    monkeypatch.setattr(audio_io, "CLOSE_WAIT_S", 0.2)
    dev = DeviceInfo(3, "Test Mic", "ALSA", 2, 2, 44100)
    quick = DeviceOutput(dev)
    quick._stream = Quick()
    quick.stop()
    assert closed == [True] and capsys.readouterr().err == ""
    src = DeviceInput(dev)
    src._stream = Stuck()
    t0 = time.monotonic()
    src.stop()
    assert time.monotonic() - t0 < 2.0 and src._stream is None and src.check() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["input device 'Test Mic' did not close within 0.2 s (its sound server is gone?); left open"]
    assert unregistered == [fake_sd._exit_handler]          # PortAudio's exit handler will not run at exit
    release.set()


def test_find_device_by_name_index_and_substring():
    devs = [DeviceInfo(0, "pulse", "ALSA", 32, 32, 44100), DeviceInfo(4, "USB Audio: mic", "ALSA", 1, 0, 48000)]
    assert find_device("pulse", devs, "input").index == 0
    assert find_device("4", devs, "input").name == "USB Audio: mic"
    assert find_device("usb", devs, "input").rate == 48000
    with pytest.raises(AudioUnavailable, match="no input device matches 'hdmi'; available: pulse"):
        find_device("hdmi", devs, "input")
    with pytest.raises(AudioUnavailable, match="no audio output devices found"):
        find_device("pulse", [], "output")


def test_missing_portaudio_is_one_clear_message(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *a, **kw):
        if name == "sounddevice":
            raise OSError("PortAudio library not found")
        return real_import(name, *a, **kw)

    monkeypatch.delitem(__import__("sys").modules, "sounddevice", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(AudioUnavailable, match="PortAudio is not available.*File input keeps working"):
        audio_io.list_devices()


# -- frame pump ---------------------------------------------------------------------------------------------

def test_level_db():
    sine = np.sin(2 * np.pi * 440 * np.arange(24000) / 24000).astype(np.float32)
    assert level_db(sine) == pytest.approx(-3.0103, abs=1e-3)
    assert level_db(0.1 * sine) == pytest.approx(-23.0103, abs=1e-3)
    assert level_db(np.zeros(100, np.float32)) == SILENCE_DB == level_db(np.zeros(0, np.float32))


class _Sink:
    def __init__(self, rate):
        from engine.echo import PlaybackQueue
        self.rate = rate
        self.queue = PlaybackQueue(rate, 10.0)
        self.played = RingBuffer(rate * 2)


def test_pump_frames_gate_and_barge_in():
    src = types.SimpleNamespace(rate=ENGINE_RATE, ring=RingBuffer(ENGINE_RATE * 4), label="test")
    submitted = []
    playback = Playback(_Sink(44100))
    pump = FramePump(src, submitted.append, playback, echo=False)

    def feed(x):
        for i in range(0, len(x), 480):
            pump.process(x[i:i + 480])

    quiet, loud, loud2 = noise(ENGINE_RATE, 0.001), noise(ENGINE_RATE, 0.3), noise(ENGINE_RATE, 0.3)
    feed(quiet)
    assert len(submitted) == 1 and np.array_equal(submitted[0], quiet)
    assert pump.level_db < -50 and pump.barge_ins == 0
    playback.push(noise(ENGINE_RATE))                # the model is talking
    pump.model_speaking = True
    assert playback.queued_s() > 0.9
    feed(loud[:1440])                                # the user starts talking: barge-in within 60 ms
    assert pump.barge_ins == 1 and playback.queued_s() == 0
    assert pump.events[-1][0] == "barge-in"
    pump.push_to_talk = True                         # push-to-talk with the key up: muted
    feed(loud[1440:])
    assert len(submitted) == 2
    assert np.array_equal(submitted[1][:1440], loud[:1440]) and not submitted[1][1440:].any()
    assert pump.level_db > -20                       # the meter still shows the (muted) mic
    pump.press_talk(True)                            # key down: the mic is open
    feed(loud2)
    assert len(submitted) == 3 and np.array_equal(submitted[2], loud2)
    pump.press_talk(False)
    assert not pump.talking and pump.submitted == len(submitted) == 3


def test_pump_thread_switches_sources_and_resamples(tmp_path):
    write_wav(tmp_path / "a.wav", np.clip(noise(44100 * 2), -1, 1), 44100)
    submitted = []
    src = FileInput(tmp_path / "a.wav", speed=40.0)
    pump = FramePump(src, submitted.append)
    src.start()
    pump.start()
    deadline = time.monotonic() + 10
    while len(submitted) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    new = FileInput(tmp_path / "a.wav", speed=40.0)
    new.rate = ENGINE_RATE                           # pretend a 24 kHz device
    new.start()
    pump.replace_source(new)
    src.stop()
    while len(submitted) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    pump.halt()
    new.stop()
    assert len(submitted) >= 4 and all(f.shape == (ENGINE_RATE,) for f in submitted)
    assert any(kind == "source" for kind, _ in pump.events)


def test_a_stream_whose_callbacks_stop_counts_as_gone(monkeypatch):
    """A sound server that dies can leave PortAudio's stream "active" with no callbacks: after STALL_S without
    one, check() reports the device stopped (the controller then goes on with silence); callbacks keep it alive."""
    monkeypatch.setattr(audio_io, "STALL_S", 0.2)
    dev = DeviceInfo(3, "Test Mic", "ALSA", 2, 2, 44100)
    ok = types.SimpleNamespace(input_overflow=False, output_underflow=False)
    for dev_cls, buf in ((DeviceInput, noise(64).reshape(-1, 1)), (DeviceOutput, np.zeros((64, 1), np.float32))):
        d = dev_cls(dev)
        d._stream = types.SimpleNamespace(active=True)
        d._heard_at = time.monotonic()
        for _ in range(4):                          # callbacks arriving: alive
            time.sleep(0.1)
            d._callback(buf, 64, None, ok)
            assert d.check() is None
        time.sleep(0.3)                             # then none for longer than STALL_S
        assert d.check() == f"{d.direction} device 'Test Mic' stopped (unplugged?)"
