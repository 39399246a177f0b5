"""Through real PortAudio: espeak-ng speech into the app over a PulseAudio null sink, and back out.

The test starts its own PulseAudio server (user mode, no kernel modules, its own socket in the
test's temporary folder) with two null sinks: "mic" (the test plays speech into it; the app
records its monitor through ALSA's "pulse" device) and "spk" (the app plays into it; the test
records its monitor with parec). The app runs as a real process: `duplexcadence --input-device
pulse --output-device pulse --seconds N --export DIR`. A second test kills the server mid-session,
as an unplugged device would vanish.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soxr

from app.pulse import PulseError, PulseServer
from engine.wavio import read_wav

ROOT = Path(__file__).resolve().parent.parent
SECONDS = 7
TURN_SECONDS = 10      # speech, the pause, the model's answer


def _tools_missing():
    return [t for t in ("pulseaudio", "pactl", "paplay", "parec") if shutil.which(t) is None]


@pytest.fixture
def pulse(tmp_path):
    """A private PulseAudio server with null sinks "mic" and "spk" (app/pulse.py); yields the client environment
    (with the server process as ``env.server`` for tests that pull the plug)."""
    missing = _tools_missing()
    if missing:
        pytest.skip(f"PulseAudio tools missing ({', '.join(missing)}); the Makefile's sysdeps installs them")
    try:
        server = PulseServer(tmp_path).__enter__()
    except PulseError as e:
        pytest.fail(str(e))
    try:
        yield _Env(server.env, server.proc)
    finally:
        server.__exit__(None, None, None)


class _Env(dict):
    def __init__(self, env, server):
        super().__init__(env)
        self.server = server


def _play_loop(env, wav: Path, stop: threading.Event, gap: float = 0.0) -> None:
    """Play ``wav`` into the "mic" sink again and again, ``gap`` seconds of silence between turns."""
    while not stop.is_set():
        p = subprocess.Popen(["paplay", "--device=mic", str(wav)], env=env)
        while p.poll() is None:
            if stop.wait(0.05):
                p.terminate()
                break
        p.wait()
        if gap and stop.wait(gap):
            break


def _found(chunk: np.ndarray, ref: np.ndarray) -> float:
    """How well ``chunk`` occurs somewhere in ``ref``: the best normalized cross-correlation over
    every alignment (1.0 = an exact, scaled copy)."""
    chunk, ref = chunk.astype(np.float64), ref.astype(np.float64)    # float32 FFTs' rounding tops 1 in silence
    m = len(chunk)
    n = 1 << int(np.ceil(np.log2(len(ref) + m)))
    c = np.fft.irfft(np.fft.rfft(ref, n) * np.conj(np.fft.rfft(chunk, n)), n)[: len(ref) - m + 1]
    energy = np.concatenate([[0.0], np.cumsum(ref ** 2)])
    window = np.sqrt(np.maximum(energy[m:] - energy[:-m], 1e-12))       # |ref[k:k+m]| for every k
    return float(np.max(np.abs(c) / (window * np.linalg.norm(chunk) + 1e-12)))


def _found_at_any_rate(chunk: np.ndarray, ref: np.ndarray, within: float = 0.005) -> float:
    """:func:`_found` at the best of the rates within ``within`` of the chunk's own: the audio path resamples the
    microphone at its measured rate and the speech at the speaker's (a servo moves it by up to 0.3 %), so what
    comes through is the same speech a few tenths of a percent faster or slower."""
    rates = np.unique(np.round(24000 * np.linspace(1 - within, 1 + within, 41)).astype(int))
    return max(_found(soxr.resample(chunk, 24000, int(r)), ref) for r in rates)


def _loud_seconds(x: np.ndarray, floor: float) -> list:
    """The one-second pieces of a 24 kHz signal whose RMS exceeds ``floor``, loudest first."""
    sec = x[: len(x) // 24000 * 24000].reshape(-1, 24000)
    rms = np.sqrt(np.mean(sec ** 2, axis=1))
    return [sec[i] for i in np.argsort(-rms) if rms[i] > floor]


def test_speech_through_pulseaudio_into_the_app_and_back_out(pulse, tmp_path, speech_wav):
    out = tmp_path / "export"
    env = dict(pulse, QT_QPA_PLATFORM="offscreen", DUPLEXCADENCE_SETTINGS=str(tmp_path / "s.ini"))
    rec = open(tmp_path / "spk.f32", "wb")
    parec = subprocess.Popen(["parec", "--device=spk.monitor", "--format=float32le", "--rate=24000",
                              "--channels=1", "--latency-msec=20"], env=pulse, stdout=rec)
    stop = threading.Event()
    # a turn of speech, then a pause in which the model answers (a synthetic-weights tail is silent
    # while it listens, so the pause is what makes it speak)
    player = threading.Thread(target=_play_loop, args=(pulse, speech_wav, stop, 4.0), daemon=True)
    player.start()
    try:
        # the raw microphone (no echo cancellation: its noise suppression reshapes the voice), so the seconds
        # the engine heard can be matched against the file that was played
        app = subprocess.run([sys.executable, "-m", "app.main", "--input-device", "pulse", "--output-device",
                              "pulse", "--seconds", str(TURN_SECONDS), "--export", str(out), "--model", "mimi",
                              "--size", "tiny", "--device", "cpu", "--no-echo-cancellation"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        time.sleep(1.5)                                  # the last second's playback drains into "spk"
    finally:
        stop.set()
        player.join(10)
        parec.terminate()
        parec.wait(10)
        rec.close()
    assert app.returncode == 0, app.stderr[-3000:]
    assert f"{TURN_SECONDS} seconds processed" in app.stdout

    # speech went in through PortAudio: the seconds the engine heard carry espeak's voice
    heard, rate = read_wav(out / "session_input.wav")
    assert rate == 24000 and len(heard) == TURN_SECONDS * 24000
    voice, vrate = read_wav(speech_wav)
    voice24 = soxr.resample(voice, vrate, 24000).astype(np.float32)
    loud = _loud_seconds(heard, 0.02)
    assert loud, "no speech reached the app"
    assert _found_at_any_rate(loud[0][4000:20000], voice24) > 0.9       # that speech, not just noise

    # and the model's audio came back out through PortAudio into the "spk" sink
    said, _ = read_wav(out / "session_output.wav")
    captured = np.fromfile(tmp_path / "spk.f32", dtype="<f4")
    spoken = _loud_seconds(said, 1e-3)
    assert spoken, "the model produced no audio"
    assert len(captured) > TURN_SECONDS * 24000 // 2
    # a barge-in may flush some of it, so any one loud second found in the recording will do
    assert max(_found_at_any_rate(sec[4000:20000], captured) for sec in spoken) > 0.9


def _wait_for_both_streams(env, app, limit_s: float = 120.0) -> None:
    """Until the app records from the server and plays into it (a busy machine can take long to start it):
    the plug is pulled mid-session, never before the devices open."""
    deadline = time.monotonic() + limit_s
    while True:
        opened = [subprocess.run(["pactl", "list", "short", kind], env=env, capture_output=True,
                                 text=True).stdout.strip() for kind in ("source-outputs", "sink-inputs")]
        if all(opened):
            return
        if app.poll() is not None or time.monotonic() > deadline:
            app.kill()
            out, err = app.communicate(timeout=30)
            pytest.fail(f"the app never opened both devices (exit {app.returncode}):\n{err[-3000:]}")
        time.sleep(0.2)


def test_audio_server_vanishing_mid_session(pulse, tmp_path, speech_wav):
    """Pull the plug (kill the sound server) mid-session: the window says so, the session goes on
    (on silence) and the scripted run still finishes every second and exits 0."""
    env = dict(pulse, QT_QPA_PLATFORM="offscreen", DUPLEXCADENCE_SETTINGS=str(tmp_path / "s.ini"),
               PYTHONFAULTHANDLER="1")           # a hang below ends with every thread's stack on stderr
    app = subprocess.Popen([sys.executable, "-m", "app.main", "--input-device", "pulse", "--output-device",
                            "pulse", "--seconds", "5", "--export", str(tmp_path / "export"), "--model", "mimi",
                            "--size", "tiny", "--device", "cpu"],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_both_streams(pulse, app)                   # started: its microphone and speaker are open
    time.sleep(2)                                        # and listening for a while
    pulse.server.terminate()
    try:
        out, err = app.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        app.send_signal(signal.SIGABRT)                  # faulthandler prints where each thread waits
        out, err = app.communicate(timeout=60)
        pytest.fail(f"the app did not end within 240 s of the server's death; its threads:\n{err[-8000:]}")
    assert app.returncode == 0, err[-3000:]
    assert "5 seconds processed" in out, err[-4000:]
    assert "input device 'pulse' stopped (unplugged?); the session continues on silence" in err
    assert (tmp_path / "export" / "session.csv").read_text().count("\n") == 6
