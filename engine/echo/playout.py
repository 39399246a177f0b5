"""The model's speech on its way to the speaker: resampled to the sink's rate into its bounded queue
(:class:`Playback`, on the thread that receives the engine's seconds), and the speaker's side of that queue
(:class:`Primed`, cheap enough for an audio callback: it keeps the session's playback delay as a buffer).

A sink is anything with ``rate``, ``queue`` (an :class:`engine.echo.PlaybackQueue`) and ``played`` (an
:class:`engine.echo.queues.RingBuffer` of what it played, the echo canceller's far end): the app's PortAudio
output, the app's simulated speaker, the echo bench's simulated devices. No Qt here.
"""
from __future__ import annotations

import collections
import threading
from typing import Deque, Tuple

import numpy as np

from engine.audio import SESSION_RATE
from engine.echo.clock import LevelServo, RateMeter
from engine.echo.queues import SILENCE_DB, PlaybackQueue, block_db
from engine.echo.resample import VariableResampler

#: the engine's audio rate (one-second frames of 24,000 samples)
ENGINE_RATE = SESSION_RATE
#: the queue's level just before a second's audio arrives, held by the servo and by skipping queued silence
#: (s): enough for the engine's seconds to arrive a little unevenly, little enough to add no delay
LEVEL_TARGET_S = 0.05
#: queued silence beyond the target by more than this is skipped when no speech is queued (s)
SKIP_SILENCE_S = 0.1
#: the servo reads the lowest level of this many pushes
LEVEL_PUSHES = 8


class Primed:
    """Playback that keeps the session's playback delay as a buffer: after the start and after the queue ran
    dry, the speaker plays silence until ``delay_s`` is queued, then plays on. Buffering is not a gap; a queue
    that runs dry while playing is (the queue counts it). Cheap enough for an audio callback."""

    queue: PlaybackQueue
    _primed = False
    _dry = False                                           # buffering again after running dry: still the gap

    def play_out(self) -> None:
        """No more audio is coming (the session's last second is done): play what is queued without waiting
        for the buffer delay."""
        self._primed, self._dry = True, False

    def pop_primed(self, n: int) -> np.ndarray:
        q = self.queue
        if not self._primed:
            if q.queued_s() < q.delay_s:
                if self._dry:
                    q.counts.gap_samples += int(n)         # the gap goes on until the buffer is back
                return np.zeros(n, dtype=np.float32)       # buffering up to the playback delay
            self._primed, self._dry = True, False
        gaps = q.counts.gap_events
        out = q.pop(n)
        if q.counts.gap_events != gaps:
            self._primed = q.delay_s <= 0                  # ran dry: buffer up again
            self._dry = not self._primed
        return out


class Playback:
    """The model's 24 kHz speech on its way to a sink: resampled to the sink's *measured* rate into its bounded
    :class:`engine.echo.PlaybackQueue`, flushable.

    A sink that stamps a ``clock`` (the (time, samples) its callback last consumed) is followed: a
    :class:`engine.echo.clock.RateMeter` measures how fast it really plays (``observe``, from any thread
    that reads the sink regularly, and at each push), and each second's audio is resampled to that rate, so a
    speaker at 81 % of its nominal rate gets 81 % of the samples and plays them in one second: nothing piles
    up and nothing is dropped. What the measurement leaves — its first seconds, its error — moves the queue's
    level slowly; a :class:`engine.echo.clock.LevelServo` holds the level just before each second's audio at
    :data:`LEVEL_TARGET_S` (at most 0.3 % of pitch), and queued silence beyond it is skipped while no speech is
    queued (counted as skipped, never as dropped speech). Only a barge-in's flush drops speech; the queue's
    own cap (the delay plus its slack) stays as the last bound.

    It remembers the level of every 20 ms of what it queued, so it can say how much of the queue
    is real speech (:meth:`speech_queued_s`: queued silence is not the model speaking) and how
    loud the audio playing right now is (:meth:`playing_level_db`, the output level meter).
    """

    #: 20 ms pieces are measured; a piece louder than ``speech_db`` (dBFS) counts as speech
    PIECE_S = 0.02
    SPEECH_DB = -45.0

    def __init__(self, sink, speech_db: float = SPEECH_DB):
        self.sink = sink
        self.speech_db = float(speech_db)
        self.meter = RateMeter(sink.rate)
        self.servo = LevelServo(LEVEL_TARGET_S, time_s=20.0, limit=0.003, slew=0.0005, smooth=1)
        self._rs = VariableResampler(ENGINE_RATE, sink.rate)
        self._lock = threading.Lock()
        self._pushed = 0                                    # samples (sink rate) ever queued
        self._pieces: Deque[Tuple[int, float]] = collections.deque()   # (end sample, level dBFS)
        self._levels: Deque[float] = collections.deque(maxlen=LEVEL_PUSHES)   # the level before each push

    def _queued(self) -> int:
        return int(round(self.sink.queue.queued_s() * self.sink.rate))

    def observe(self) -> None:
        """Read the sink's clock into the rate meter (cheap; any thread)."""
        clock = getattr(self.sink, "clock", None)
        if clock is not None:
            self.meter.stamp(*clock)

    @property
    def step(self) -> float:
        """Engine samples per sink sample: the sink's measured rate, servoed by the queue's level."""
        return ENGINE_RATE / self.meter.rate() * (1.0 + self.servo.correction)

    def push(self, audio: np.ndarray, second: int = -1) -> float:
        """Queue one piece of model audio (of input second ``second``); returns the seconds queued ahead
        of it (after any late audio the queue dropped to stay bounded)."""
        self.observe()
        with self._lock:
            self._hold_level()
            y = self._rs.process(np.ascontiguousarray(audio, dtype=np.float32).reshape(-1), self.step)
            self.sink.queue.push(y, second)
            ahead = max(0.0, self.sink.queue.queued_s() - len(y) / self.sink.rate)
            piece = max(1, int(self.PIECE_S * self.sink.rate))
            for i in range(0, len(y), piece):
                self._pieces.append((self._pushed + min(len(y), i + piece), block_db(y[i:i + piece])))
            self._pushed += len(y)
        return ahead

    def _hold_level(self) -> None:
        """Before a push: the servo reads the lowest recent level; silence queued beyond the target is skipped
        while no speech is queued."""
        q = self.sink.queue
        level = q.queued_s()
        self._levels.append(level)
        self.servo.update(min(self._levels))
        if level > LEVEL_TARGET_S + SKIP_SILENCE_S and self._speech_queued() == 0:
            q.skip_silence(int((level - LEVEL_TARGET_S) * self.sink.rate))

    def queued_s(self) -> float:
        """Seconds of audio waiting to be played (speech and silence)."""
        return self.sink.queue.queued_s()

    def _played_to(self) -> int:
        """Drop the pieces already played; returns the sample position playing now."""
        pos = self._pushed - self._queued()
        while self._pieces and self._pieces[0][0] <= pos:
            self._pieces.popleft()
        return pos

    def _speech_queued(self) -> int:
        pos = self._played_to()
        n, start = 0, pos
        for end, db in self._pieces:
            if db > self.speech_db:
                n += end - max(start, pos)
            start = end
        return n

    def speech_queued_s(self) -> float:
        """Seconds of queued audio louder than ``speech_db``: what a barge-in would cut off."""
        with self._lock:
            return self._speech_queued() / self.sink.rate

    def playing_level_db(self) -> float:
        """The level of the 20 ms playing now (SILENCE_DB when nothing is queued)."""
        with self._lock:
            self._played_to()
            return self._pieces[0][1] if self._pieces else SILENCE_DB

    def flush(self) -> float:
        """Drop all queued playback (barge-in); returns the seconds dropped."""
        with self._lock:
            n = self.sink.queue.flush()
            self._rs.reset()
            self._pushed = self._pushed - n
            self._pieces.clear()
        return n / self.sink.rate
