"""The last seconds' speech is heard: when the input ends, the seconds the engine is still finishing are played,
and the session stops only when the speaker has played them (under load the pulse test's model once
answered in seconds that finished after the input ended, and their audio was dropped unplayed)."""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np

from app import controller as ctl
from app.audio_io import Primed, RingBuffer, SilentInput
from engine.echo import PlaybackQueue
from engine.session import SessionConfig
from test_app_fakes import SlowRunner, make_window

TINY = SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu", graph_replay=False)


class PacedSpeaker(Primed):
    """A sink whose "device" takes 20 ms blocks in real time on its own thread and keeps what it played."""

    def __init__(self, rate: int = 24000, delay_s: float = 0.5):
        self.rate, self.label, self.latency_s = rate, "paced test speaker", 0.02
        self.queue = PlaybackQueue(rate, delay_s)
        self.played = RingBuffer(rate * 2)
        self.heard = []
        self.xruns, self.failure = 0, None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = self.rate // 50
        while not self._stop.wait(0.02):
            out = self.pop_primed(n)
            self.played.write(out)
            self.heard.append(out)

    def stop(self) -> None:
        self._stop.set()

    def check(self):
        return None


def test_the_seconds_finished_after_the_input_ended_are_played(qtbot, tmp_path):
    speaker = PacedSpeaker()
    w = make_window(qtbot, tmp_path, lambda cfg: SlowRunner(cfg, work_s=1.2))   # the engine falls behind
    # a silent microphone: no barge-in flushes the model's speech, so every second's audio must be heard
    assert w.start_with(TINY, SilentInput(24000), sink=speaker, max_seconds=3)
    c = w.controller
    qtbot.waitUntil(lambda: c.state == ctl.DRAINING, timeout=30000)
    at_drain = len(c.records)
    assert at_drain < 3                                   # some seconds finish after the input ended
    qtbot.waitUntil(lambda: c.state == ctl.IDLE, timeout=30000)
    assert len(c.records) == 3
    heard = np.concatenate(speaker.heard)
    # each second is 1 s of a 0.1-amplitude sine (energy 0.005 a sample): all three were played, the last
    # half-second (under the 0.5 s buffer delay) included
    energy = float(np.sum(heard.astype(np.float64) ** 2))
    assert energy > 0.97 * 3 * 24000 * 0.005, energy / (24000 * 0.005)
    assert speaker.queue.queued_s() == 0.0
