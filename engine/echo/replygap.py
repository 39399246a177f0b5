"""The wait a user feels: from the end of their speech to the model's first audio at the speaker, per turn.

:class:`ReplyGapMeter` reads the two streams the audio path already lines up sample for sample: the
barge-in detector's talks on the cleaned microphone (a talk ends at its last voiced 20 ms frame, confirmed
``quiet_s`` later) and the speaker's played samples brought to the microphone's rate and clock
(:class:`engine.echo.align.FarAligner`). A turn's gap is the distance, on that common axis, from the talk's
end to the first 20 ms of the speaker's audio above ``speech_db`` after it, plus what lies outside the axis:
the input latency (the microphone sample reached the path that long after it was spoken), the output latency
(the played sample sounds that long after the path saw it) less the aligner's margin (the reference runs
that far ahead of the microphone). Turns the model was already speaking over, or that the user followed with
another before any reply, have no gap (counted as ``overlapped`` and ``unanswered``).
"""
from __future__ import annotations

import collections
from typing import Deque, List, Optional

import numpy as np

#: a 20 ms frame of the speaker's audio louder than this (dBFS) is the model speaking
SPEECH_DB = -45.0


class ReplyGapMeter:
    """``push(ref, detector, extra_ms)`` once per block, after the detector read the block: ``ref`` is the
    speaker's audio lined up with the block (as many samples), ``extra_ms`` the latencies outside the common
    axis. Returns the gaps (ms) of the turns answered in this block; ``gaps_ms`` keeps them all."""

    def __init__(self, rate: int, speech_db: float = SPEECH_DB):
        self.rate = int(rate)
        self.win = max(1, self.rate // 50)
        self.speech_db = float(speech_db)
        self.pos = 0                                             # speaker samples read, whole frames
        self._carry = np.zeros(0, dtype=np.float32)
        self._speech: Deque[List[int]] = collections.deque(maxlen=512)   # [start, end) of speaker speech
        self._seen = 0                                           # the detector's talks already read
        self._pending: Optional[int] = None                      # the end of a talk not answered yet
        self.gaps_ms: Deque[float] = collections.deque(maxlen=4096)
        self.measured = 0                                        # gaps measured, in all
        self.overlapped = 0
        self.unanswered = 0

    def push(self, ref: np.ndarray, detector, extra_ms: float = 0.0) -> List[float]:
        self._read_speaker(np.asarray(ref, dtype=np.float32).reshape(-1))
        for onset, end in self._new_talks(detector):
            if self._pending is not None:
                self.unanswered += 1                             # talked again before any reply
            self._pending = None
            if self._speaking_at(end):
                self.overlapped += 1
            else:
                self._pending = end
        if self._pending is not None and detector.talking and detector._onset_at > self._pending:
            self.unanswered += 1
            self._pending = None
        return self._answer(extra_ms)

    def _read_speaker(self, ref: np.ndarray) -> None:
        x = np.concatenate([self._carry, ref]) if self._carry.size else ref
        n = x.size // self.win
        self._carry = x[n * self.win:].copy()
        if n == 0:
            return
        db = 10.0 * np.log10(np.mean(np.square(x[:n * self.win].reshape(n, self.win), dtype=np.float64),
                                     axis=1) + 1e-12)
        for i in np.flatnonzero(db > self.speech_db):
            at = self.pos + int(i) * self.win
            if self._speech and self._speech[-1][1] >= at:
                self._speech[-1][1] = at + self.win
            else:
                self._speech.append([at, at + self.win])
        self.pos += n * self.win

    def _new_talks(self, detector) -> List[tuple]:
        total = detector.talks_ended
        new = list(detector.talks)[len(detector.talks) - min(total - self._seen, len(detector.talks)):]
        self._seen = total
        return new

    def _speaking_at(self, sample: int) -> bool:
        return any(a <= sample < b + self.win for a, b in self._speech)

    def _answer(self, extra_ms: float) -> List[float]:
        if self._pending is None:
            return []
        for a, _ in self._speech:
            if a >= self._pending:
                gap = (a - self._pending) * 1000.0 / self.rate + extra_ms
                self._pending = None
                self.gaps_ms.append(gap)
                self.measured += 1
                return [gap]
        return []
