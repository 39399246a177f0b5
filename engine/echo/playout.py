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
import soxr

from engine.audio import SESSION_RATE
from engine.echo.queues import SILENCE_DB, PlaybackQueue, block_db

#: the engine's audio rate (one-second frames of 24,000 samples)
ENGINE_RATE = SESSION_RATE


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
    """The model's 24 kHz speech on its way to a sink: resampled to the sink's rate into its bounded
    :class:`engine.echo.PlaybackQueue` (late speech is dropped there, counted), flushable.

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
        self._rs = (soxr.ResampleStream(ENGINE_RATE, sink.rate, 1, dtype="float32", quality="HQ")
                    if sink.rate != ENGINE_RATE else None)
        self._lock = threading.Lock()
        self._pushed = 0                                    # samples (sink rate) ever queued
        self._pieces: Deque[Tuple[int, float]] = collections.deque()   # (end sample, level dBFS)

    def _queued(self) -> int:
        return int(round(self.sink.queue.queued_s() * self.sink.rate))

    def push(self, audio: np.ndarray, second: int = -1) -> float:
        """Queue one piece of model audio (of input second ``second``); returns the seconds queued ahead
        of it (after any late audio the queue dropped to stay bounded)."""
        with self._lock:
            x = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
            y = x.copy() if self._rs is None else self._rs.resample_chunk(x)
            self.sink.queue.push(y, second)
            ahead = max(0.0, self.sink.queue.queued_s() - len(y) / self.sink.rate)
            piece = max(1, int(self.PIECE_S * self.sink.rate))
            for i in range(0, len(y), piece):
                self._pieces.append((self._pushed + min(len(y), i + piece), block_db(y[i:i + piece])))
            self._pushed += len(y)
        return ahead

    def queued_s(self) -> float:
        """Seconds of audio waiting to be played (speech and silence)."""
        return self.sink.queue.queued_s()

    def _played_to(self) -> int:
        """Drop the pieces already played; returns the sample position playing now."""
        pos = self._pushed - self._queued()
        while self._pieces and self._pieces[0][0] <= pos:
            self._pieces.popleft()
        return pos

    def speech_queued_s(self) -> float:
        """Seconds of queued audio louder than ``speech_db``: what a barge-in would cut off."""
        with self._lock:
            pos = self._played_to()
            n, start = 0, pos
            for end, db in self._pieces:
                if db > self.speech_db:
                    n += end - max(start, pos)
                start = end
        return n / self.sink.rate

    def playing_level_db(self) -> float:
        """The level of the 20 ms playing now (SILENCE_DB when nothing is queued)."""
        with self._lock:
            self._played_to()
            return self._pieces[0][1] if self._pieces else SILENCE_DB

    def flush(self) -> float:
        """Drop all queued playback (barge-in); returns the seconds dropped."""
        with self._lock:
            n = self.sink.queue.flush()
            if self._rs is not None:
                self._rs.clear()
            self._pushed = self._pushed - n
            self._pieces.clear()
        return n / self.sink.rate
