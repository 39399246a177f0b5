"""Barge-in in a blink: a voice-onset detector on short frames of the echo-cancelled microphone, and the
ducking decision it drives (the app ducks playback at once; the engine follows at its next second).

:class:`BargeInDetector` reads 20 ms frames. A frame is voiced above ``max(abs_db, floor + margin_db)``
(the floor: the quietest frame of the last 1.5 s, so steady noise is not speech); ``onset_frames`` voiced frames among ``onset_frames + 1`` (the newest
voiced) make the user *talking*, and ``quiet_s`` of unvoiced frames end the talk (pauses between words do not);
``talks`` keeps (onset, end) of the talks that ended (the end: the sample after the last voiced frame). While the
user talks and the model's speech is playing, the detector fires once per talk: a :class:`BargeIn` comes
back and :attr:`BargeInDetector.ducked` turns True. The caller silences playback while ``ducked`` and tells
the detector which engine seconds' speech it plays (:meth:`BargeInDetector.allows`): speech the engine made
from input up to the second the user started in is dropped; the first later second releases the duck (the
engine heard the user by then and answers with silence, or with its reply once the user stops).
No Qt here: the app's frame pump calls it from its worker thread.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Deque, List, Optional

import numpy as np

#: the interrupt sensitivity presets the app offers: (abs_db, margin_db)
SENSITIVITY = {"low": (-32.0, 18.0), "normal": (-40.0, 14.0), "high": (-48.0, 10.0)}


@dataclass
class BargeIn:
    """One barge-in: where it fired and where the user's talk began (samples of the detector's input)."""

    fired_at: int          # the sample after the frame that fired
    onset_at: int          # the first sample of the talk's first voiced frame
    second: int            # the input second the talk began in (the engine's frame index)

    def latency_ms(self, rate: int) -> float:
        """Detection latency: talk onset to firing."""
        return (self.fired_at - self.onset_at) * 1000.0 / rate


class BargeInDetector:
    """Short-frame voice onsets on the echo-cancelled microphone -> barge-ins and ducking.

    ``push(chunk, playing)``: microphone samples (any chunk size; frames carry over) and whether the model's
    speech is playing now; returns the barge-ins fired. ``ducked``: playback must be silent. ``allows(k)``:
    whether the speech the engine made from input second ``k`` may play (it releases the duck for ``k``
    after the talk's second). ``sensitivity`` picks a preset of :data:`SENSITIVITY`.
    """

    def __init__(self, rate: int, frame_ms: float = 20.0, onset_frames: int = 2, quiet_s: float = 0.5,
                 sensitivity: str = "normal", abs_db: Optional[float] = None, margin_db: Optional[float] = None):
        if sensitivity not in SENSITIVITY:
            raise ValueError(f"unknown interrupt sensitivity {sensitivity!r}; choose one of: {', '.join(SENSITIVITY)}")
        self.rate = int(rate)
        self.win = max(1, int(round(self.rate * frame_ms / 1000.0)))
        preset = SENSITIVITY[sensitivity]
        self.abs_db = preset[0] if abs_db is None else float(abs_db)
        self.margin_db = preset[1] if margin_db is None else float(margin_db)
        self.onset_frames = int(onset_frames)
        self.quiet_frames = max(1, int(round(quiet_s * self.rate / self.win)))
        self.floor_db = -70.0          # the noise floor: the quietest 20 ms of the last 1.5 s (speech has gaps)
        self._levels: Deque[float] = collections.deque(maxlen=max(2, int(round(1.5 * self.rate / self.win))))
        self.pos = 0                   # samples consumed (whole frames)
        self.talking = False           # the user is talking (onset confirmed, not yet quiet_s of quiet)
        self.talks: Deque[tuple] = collections.deque(maxlen=64)   # (onset, end) of each talk that ended
        self.talks_ended = 0           # talks that ended, in all
        self._voiced_end = 0           # the sample after the last voiced frame
        self.ducked = False
        self.fired: List[BargeIn] = []
        self._carry = np.zeros(0, dtype=np.float32)
        # the last onset_frames + 1 frames (voiced, first sample): an onset is onset_frames voiced among them,
        # the newest voiced (the echo canceller may pass a talk's first 10 ms frames one in two)
        self._recent: Deque[tuple] = collections.deque(maxlen=self.onset_frames + 1)
        self._quiet = self.quiet_frames
        self._onset_at = 0
        self._talk_fired = False
        self._duck_second = -1

    def set_sensitivity(self, sensitivity: str) -> None:
        """Change the thresholds to a preset of :data:`SENSITIVITY` (from the next frame)."""
        if sensitivity not in SENSITIVITY:
            raise ValueError(f"unknown interrupt sensitivity {sensitivity!r}; choose one of: {', '.join(SENSITIVITY)}")
        self.abs_db, self.margin_db = SENSITIVITY[sensitivity]

    def threshold_db(self) -> float:
        return max(self.abs_db, self.floor_db + self.margin_db)

    def push(self, chunk: np.ndarray, playing: bool) -> List[BargeIn]:
        """Feed microphone samples; ``playing``: the model's speech is playing. Returns barge-ins fired."""
        x = np.concatenate([self._carry, np.asarray(chunk, dtype=np.float32).reshape(-1)])
        n = x.size // self.win
        self._carry = x[n * self.win:]
        out = []
        for i in range(n):
            w = x[i * self.win:(i + 1) * self.win].astype(np.float64)
            hit = self._frame(10.0 * math.log10(float(np.mean(w * w)) + 1e-12), bool(playing))
            if hit is not None:
                out.append(hit)
        self.fired.extend(out)
        return out

    def _frame(self, db: float, playing: bool) -> Optional[BargeIn]:
        start, self.pos = self.pos, self.pos + self.win
        self._levels.append(db)
        if len(self._levels) == self._levels.maxlen:
            self.floor_db = min(self._levels)           # the quietest frame of the last 1.5 s: steady noise
        voiced = db > self.threshold_db()
        self._recent.append((voiced, start))
        if voiced:
            self._quiet = 0
            self._voiced_end = self.pos
            hits = [at for v, at in self._recent if v]
            if not self.talking and len(hits) >= self.onset_frames:
                self.talking, self._talk_fired, self._onset_at = True, False, hits[0]
        else:
            self._quiet += 1
            if self._quiet >= self.quiet_frames and self.talking:
                self.talking = False
                self.talks.append((self._onset_at, self._voiced_end))
                self.talks_ended += 1
        if self.talking and playing and not self._talk_fired and not self.ducked:
            self._talk_fired = True
            return self._duck(BargeIn(self.pos, self._onset_at, self._onset_at // self.rate))
        return None

    def _duck(self, b: BargeIn) -> BargeIn:
        self.ducked = True
        self._duck_second = max(self._duck_second, b.second)
        return b

    def allows(self, second: int) -> bool:
        """Whether the engine's speech made from input second ``second`` may play. While ducked, speech from
        the talk's second or earlier is dropped; a later second releases the duck (the engine has heard the
        user)."""
        if self.ducked and second > self._duck_second:
            self.ducked = False
        return not self.ducked
