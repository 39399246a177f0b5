"""A simulated room for scripted runs and tests: the model's speech plays through a "speaker" whose sound comes
back into the "microphone" over an echo path, on one clock, with no audio device.

:class:`LoopbackOutput` is a sink like :class:`app.audio_io.DeviceOutput` (a bounded
:class:`engine.echo.PlaybackQueue` and the ``played`` far-end ring); :class:`LoopbackInput` plays a WAV as the
user's voice and, every 20 ms block, pops the speaker's next block, records it as played and adds what the
echo path (engine/echo/room.py: ``delay_ms`` later, ``gain_db`` quieter, a short room response) makes of
it — what a laptop without headphones does. ``duplexcadence --input-file IN.wav --simulate-echo 120:-10``
uses it; so do the app's echo tests and the screenshots.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from app.audio_io import FileInput, Primed, RingBuffer
from engine.echo import PlaybackQueue
from engine.echo.room import EchoPath


def parse_echo(spec: str) -> Tuple[float, float]:
    """"DELAY_MS:GAIN_DB" -> (delay ms, gain dB); ValueError with one line naming the fix."""
    try:
        delay, gain = (float(v) for v in str(spec).split(":"))
    except ValueError:
        raise ValueError(f"--simulate-echo takes DELAY_MS:GAIN_DB (e.g. 120:-10); got {spec!r}") from None
    if not 0 <= delay <= 1000 or not -60 <= gain <= 0:
        raise ValueError(f"--simulate-echo: the delay is 0-1000 ms and the gain -60-0 dB; got {spec!r}")
    return delay, gain


class LoopbackOutput(Primed):
    """The simulated speaker (at the input's rate): what the session queues plays when :class:`LoopbackInput`
    asks for its next block."""

    def __init__(self, rate: int, delay_ms: float = 120.0, gain_db: float = -10.0, seed: int = 0,
                 delay_s: float = 0.0):
        self.rate = int(rate)
        self.label = f"simulated speaker ({delay_ms:g} ms, {gain_db:g} dB echo)"
        self.queue = PlaybackQueue(self.rate, delay_s)
        self.played = RingBuffer(self.rate * 2)
        self.path = EchoPath(delay_ms, gain_db, seed, self.rate)
        self.latency_s = 0.02                    # one block: what the loop reports, like a device would
        self.xruns = 0
        self.failure: Optional[str] = None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def check(self) -> Optional[str]:
        return None

    def play(self, n: int) -> np.ndarray:
        """The speaker's next ``n`` samples (as a callback would write them) -> what the microphone hears."""
        out = self.pop_primed(n)
        self.played.write(out)
        return self.path(out)


class LoopbackInput(FileInput):
    """A WAV as the user's voice plus the simulated speaker's echo, at real-time pace; ``sink`` is its speaker."""

    def __init__(self, path, delay_ms: float = 120.0, gain_db: float = -10.0, seed: int = 0, speed: float = 1.0,
                 max_seconds: Optional[float] = None):
        super().__init__(path, speed, max_seconds)
        self.sink = LoopbackOutput(self.rate, delay_ms, gain_db, seed)
        self.latency_s = 0.02
        self.label = f"file {path} + echo"

    def _block(self, n: int) -> np.ndarray:
        return super()._block(n) + self.sink.play(n)
