"""Barge-in counts only queued speech; the output level; waveforms and mic-to-speaker delay (no Qt)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from app.audio_io import ENGINE_RATE, SILENCE_DB, Playback, RingBuffer
from app.monitor import AudioMonitor, Envelope, Spectra
from app.pump import FramePump
from engine.echo import PlaybackQueue

BARGE_IN_QUIET_S = 0.5


class _Sink:
    def __init__(self, rate: int, delay_s: float = 10.0):
        self.rate = rate
        self.queue = PlaybackQueue(rate, delay_s)
        self.played = RingBuffer(rate * 2)


def noise(n: int, scale: float = 0.3, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def feed(pump: FramePump, x: np.ndarray, block: int = 480) -> None:
    for i in range(0, len(x), block):
        pump.process(x[i:i + block])


def test_playback_knows_how_much_queued_audio_is_speech():
    sink = _Sink(ENGINE_RATE)                                        # same rate: exact positions
    pb = Playback(sink)
    assert pb.push(np.zeros(ENGINE_RATE, np.float32)) == 0.0          # nothing was ahead of it
    assert pb.queued_s() == pytest.approx(1.0, abs=0.02) and pb.speech_queued_s() == 0.0
    assert pb.playing_level_db() == SILENCE_DB
    sink.queue.pop(int(0.9 * ENGINE_RATE))                           # 0.9 s of it played
    ahead = pb.push(noise(ENGINE_RATE // 2, 0.1))                    # half a second of speech after it
    assert ahead == pytest.approx(0.1, abs=0.02)
    assert pb.speech_queued_s() == pytest.approx(0.5, abs=0.03)
    sink.queue.pop(int(0.3 * ENGINE_RATE))                           # 0.3 s more played: into the speech
    assert pb.speech_queued_s() == pytest.approx(0.3, abs=0.03)
    assert pb.playing_level_db() == pytest.approx(-20.0, abs=1.5)
    assert pb.flush() == pytest.approx(0.3, abs=0.03)
    assert pb.speech_queued_s() == 0.0 and pb.queued_s() == 0.0 and pb.playing_level_db() == SILENCE_DB
    pb.push(noise(ENGINE_RATE, 0.1))                                 # positions stay right after a flush
    assert pb.speech_queued_s() == pytest.approx(1.0, abs=0.03)
    pb48 = Playback(_Sink(48000))                                    # resampled into a 48 kHz device
    pb48.push(np.r_[np.zeros(ENGINE_RATE), noise(ENGINE_RATE, 0.1)].astype(np.float32))
    assert pb48.speech_queued_s() == pytest.approx(1.0, abs=0.05) and pb48.queued_s() > 1.9


def _pump():
    src = types.SimpleNamespace(rate=ENGINE_RATE, ring=RingBuffer(ENGINE_RATE * 4), label="test")
    pb = Playback(_Sink(ENGINE_RATE))
    return FramePump(src, lambda f: None, pb, echo=False), pb


def test_queued_silence_is_not_the_model_speaking():
    pump, pb = _pump()
    feed(pump, noise(ENGINE_RATE, 0.001))
    pb.push(np.zeros(ENGINE_RATE, np.float32))       # a listening second: silence queued
    pump.model_speaking = True                       # even when the second's decision said "speak"
    feed(pump, noise(4800, 0.3))                     # the user starts talking
    assert pump.barge_ins == 0 and pb.queued_s() > 0.5 and not pump.events


def test_pauses_between_words_are_not_new_barge_ins():
    pump, pb = _pump()
    feed(pump, noise(ENGINE_RATE, 0.001))
    pb.push(noise(ENGINE_RATE, 0.1))                 # the model is talking
    feed(pump, noise(4800, 0.3))                     # onset: one barge-in
    assert pump.barge_ins == 1 and pb.queued_s() == 0
    assert pump.events[-1][1].startswith("user started talking: flushed 1.00 s of playback; silent ")
    assert not pump.allows(1)                        # speech made from the onset's second: not played
    assert pump.allows(2)                            # the engine heard the user: its next second plays
    pb.push(noise(ENGINE_RATE, 0.1, seed=1))         # the model speaks again
    gap = int(0.5 * BARGE_IN_QUIET_S * ENGINE_RATE)
    feed(pump, np.r_[noise(gap, 0.001), noise(4800, 0.3)])   # a short pause between words
    assert pump.barge_ins == 1 and pb.speech_queued_s() > 0.9
    feed(pump, np.r_[noise(int(1.2 * BARGE_IN_QUIET_S * ENGINE_RATE), 0.001), noise(4800, 0.3)])
    assert pump.barge_ins == 2                       # a real new turn after a pause
    assert all("flushed 0.00" not in text for _, text in pump.events)


def test_holding_push_to_talk_flushes_once():
    pump, pb = _pump()
    pump.push_to_talk = True
    pb.push(noise(ENGINE_RATE, 0.1))
    pump.press_talk(True)
    assert pump.barge_ins == 1
    pb.push(noise(ENGINE_RATE, 0.1, seed=2))
    for _ in range(3):                               # key autorepeat while held: no more flushes
        pump.press_talk(True)
    assert pump.barge_ins == 1 and pb.speech_queued_s() > 0.9
    pump.press_talk(False)
    pump.press_talk(True)                            # a new press is a new barge-in
    assert pump.barge_ins == 2


def test_envelope_scrolls_on_the_wall_clock():
    env = Envelope(span_s=1.0, col_s=0.1)
    x = np.r_[np.full(2400, 0.5), np.full(2400, -0.25)].astype(np.float32)   # 0.2 s at 24 kHz
    env.add(10.0, x, 24000)
    t, lo, hi = env.view(10.25)
    assert len(t) == 10 and t[-1] == 0.0 and t[0] == pytest.approx(-0.9)
    assert hi[-3] == pytest.approx(0.5) and lo[-2] == pytest.approx(-0.25)   # columns 10.0-10.1, 10.1-10.2
    assert not hi[:-3].any() and hi[-1] == 0.0
    t, lo, hi = env.view(20.0)                      # long after: scrolled out, empty
    assert not hi.any() and not lo.any()


def test_mic_to_speaker_delay():
    now = [100.0]
    mon = AudioMonitor(clock=lambda: now[0])
    mon.on_frame(0)                                  # frame 0 complete at t=100
    now[0] = 100.3                                   # its answer is ready 300 ms later ...
    delay = mon.on_answer(0, noise(ENGINE_RATE, 0.1), ENGINE_RATE, queued_ahead_s=0.5)   # ... behind 0.5 s
    assert delay == pytest.approx(800.0) and mon.delay_for(0) == pytest.approx(800.0) and mon.playing
    now[0] = 101.0                                   # queued for a device: drawn only as it plays
    assert not mon.speech.view(now[0])[2].any()
    mon.on_played(noise(int(0.2 * ENGINE_RATE), 0.1), ENGINE_RATE)   # the callback played 0.2 s until now
    t, lo, hi = mon.speech.view(now[0])
    assert hi[t < -0.22].max() == 0 and hi[t > -0.18].max() > 0.2
    mon.on_frame(1)
    now[0] = 101.3
    assert mon.on_answer(1, noise(ENGINE_RATE, 0.1), ENGINE_RATE, None) == pytest.approx(300.0)
    assert not mon.playing
    assert np.isnan(mon.on_answer(7, noise(10), ENGINE_RATE, None)) and mon.delay_for(7) is None


def test_the_sound_view_shows_only_what_played():
    """Speech dropped (late, or by a barge-in) never reaches the callback, so it is never drawn; speech that
    plays long after it was made (playback far behind) is drawn when it plays."""
    now = [50.0]
    mon = AudioMonitor(clock=lambda: now[0])
    for k in range(8):                               # 8 s of answers queued far ahead (playback 6 s behind)
        mon.on_frame(k)
        mon.on_answer(k, noise(ENGINE_RATE, 0.1), ENGINE_RATE, queued_ahead_s=6.0 + k)
    assert not mon.speech.view(now[0])[2].any()      # nothing played yet: nothing drawn
    mon.on_played(noise(ENGINE_RATE // 2, 0.1), ENGINE_RATE)
    assert mon.speech.view(now[0])[2][-11:-1].min() > 0.05


def test_spectrogram_transforms_only_new_hops():
    sp = Spectra(2.0)
    tone = (0.3 * np.sin(2 * np.pi * 1000 * np.arange(ENGINE_RATE) / ENGINE_RATE)).astype(np.float32)
    sp.add_mic(tone, ENGINE_RATE)
    mic, speech = sp.images()
    assert mic.shape == speech.shape == (125, 257)
    assert int(np.argmax(mic[-1])) == 32 and mic[-1].max() > -30     # 1 kHz = bin 32 of 512 at 16 kHz
    assert speech.max() == -100.0                                   # the model said nothing
    before = sp._rolls[0].done
    sp.add_mic(np.zeros(2400, np.float32), ENGINE_RATE)              # 0.1 s of silence: a few new hops
    mic2, _ = sp.images()
    assert sp._rolls[0].done - before <= 1600 + 256 and mic2[-1].max() < mic[-1].max()


def test_barge_in_latency_counts_from_when_the_model_started_over_the_user():
    """The user is already talking when the model starts: the latency runs from the model's start, not from
    the user's onset a second earlier."""
    pump, pb = _pump()
    feed(pump, noise(ENGINE_RATE, 0.001))
    feed(pump, noise(ENGINE_RATE, 0.3, seed=3))      # the user talks; nothing plays: no barge-in
    assert pump.barge_ins == 0
    pb.push(noise(ENGINE_RATE, 0.1, seed=4))         # the model starts over them
    feed(pump, noise(4800, 0.3, seed=5))
    assert pump.barge_ins == 1 and pump.barge_in_ms[-1] < 100.0
