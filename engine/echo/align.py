"""The echo canceller's reference, lined up with the microphone for a whole session.

AEC3 cancels an echo only when its reference (what the speaker played) reaches it *before* the echo does, at
the microphone's own rate. The audio layer hands both over in blocks whose sizes and timing differ, from
two device clocks that differ too. Paired naively (queue the far end, take one frame of it per microphone
frame) the pairing creeps (measured, docs/echo.md):

* a speaker whose clock runs faster than the microphone's delivers more far samples than the microphone
  frames take: the queue grows by the difference, the reference falls behind its own echo, and once it lags
  by more than the echo path's delay AEC3 has nothing to cancel with (0.1 % faster: from 75 dB to 14 dB in
  three minutes at a 150 ms path; 1 %: 4-8 dB at once);
* a far block that arrives a little after its microphone block left a frame of zeros in its place, and the
  late samples were then played to AEC3 one frame later than before, for good: each such moment moved the
  pairing by a frame, always the same way, so the lag only grew;
* at clocks 19 % apart the echo is a time-stretched copy of the reference no linear filter can match.

:class:`FarAligner` keeps the pairing fixed. It resamples the far end by the ratio of the two streams'
sample counts (far samples delivered per microphone sample, fitted over the last ``window_s``: what the two
clocks really did, with no clock read), so the reference runs at the microphone's rate; a far sample that
comes after its microphone samples were processed (zeros went in its place) is skipped, not played late;
and the queue's low level is held near ``margin_s`` by a slow servo on the ratio (at most 0.5 %, 5 ms a
second: AEC3 follows that; measured), or by one jump where it is off by more than ``jump_s`` (a stall, a
device restarted), with one event line.
"""
from __future__ import annotations

import collections
from typing import Deque, List, Optional, Tuple

import numpy as np

from engine.echo.clock import LevelServo
from engine.echo.resample import VariableResampler

#: the queue's low level the aligner holds (s): the reference runs this far ahead of the microphone; the servo
#: leaves the level alone within DEADBAND_S of it (the low level of callbacks in blocks of 10-25 ms jitters by
#: that much, and a servo that followed it would walk the pairing about by milliseconds)
MARGIN_S = 0.015
DEADBAND_S = 0.008
#: a low level off its target by more than this is corrected at once (s), not by the servo
JUMP_S = 0.08
#: the low level is the lowest of the last two seconds' blocks, handed to the servo every quarter second
LOW_WINDOW_S = 2.0
SERVO_EVERY_S = 0.25
#: corrections in the far end's first seconds (the ratio not fitted yet) are the start, not an event
SETTLE_S = 3.0


class FarAligner:
    """``push(played)``: the speaker's samples since the last block (``far_rate``, as the device counts them);
    ``take(n)``: ``n`` reference samples at ``rate`` for the ``n`` microphone samples of this block.

    ``step`` is the far samples used per reference sample (``far_rate / rate`` when the clocks agree);
    ``starved`` counts reference samples given as zeros (their far samples came late and are skipped);
    ``jumps`` the corrections made at once; ``events`` their lines (drained by the caller).
    """

    def __init__(self, far_rate: float, rate: float, margin_s: float = MARGIN_S, window_s: float = 30.0):
        self.far_rate, self.rate = float(far_rate), float(rate)
        self.nominal_step = self.far_rate / self.rate
        self._rs = VariableResampler(far_rate, rate)
        self._buf = np.zeros(0, dtype=np.float32)
        self._debt = 0                  # reference samples given as zeros whose far samples have not come yet
        self.margin = int(round(margin_s * self.rate))
        self.bulk = 0                   # the reference held back on purpose (samples): the echo path's delay
        self.window = window_s * self.rate
        self.far_in = 0                 # far samples pushed
        self.taken = 0                  # reference samples taken
        self._pairs: Deque[Tuple[int, int]] = collections.deque()     # (taken, far_in) about every 0.1 s
        self._lows: Deque[Tuple[int, int]] = collections.deque()      # (taken, level after the take)
        self._next_servo = 0
        self._first = None              # reference samples taken when the far end first came
        self._far_seen = -1             # far samples pushed at the last servo step
        self.servo = LevelServo(margin_s, time_s=8.0, limit=0.005, slew=0.0005, smooth=8, deadband=DEADBAND_S)
        self.step_fit = self.nominal_step
        self.starved = 0
        self.jumps = 0
        self.events: List[str] = []

    @property
    def step(self) -> float:
        return self.step_fit * (1.0 + self.servo.correction)

    def level(self) -> int:
        """Reference samples ready ahead of the microphone (negative: owed)."""
        return self._buf.size - self._debt

    def push(self, played: np.ndarray) -> None:
        x = np.asarray(played, dtype=np.float32).reshape(-1)
        if x.size == 0:
            return
        self.far_in += x.size
        y = self._rs.process(x, self.step)
        skip = min(self._debt, y.size)
        self._debt -= skip
        self._buf = np.concatenate([self._buf, y[skip:]])

    def take(self, n: int) -> np.ndarray:
        out = np.zeros(int(n), dtype=np.float32)
        got = min(int(n), self._buf.size)
        out[:got], self._buf = self._buf[:got], self._buf[got:]
        self._debt += int(n) - got
        self.starved += int(n) - got
        self.taken += int(n)
        self._track()
        return out

    def _track(self) -> None:
        """Refit the ratio, and hold the low level at the margin (servo, or a jump), while the speaker plays
        (the far end flowed within the last second)."""
        if self.far_in == 0:
            return
        if self._first is None:
            self._first = self.taken
        if not self._pairs or self.taken - self._pairs[-1][0] >= 0.1 * self.rate:
            self._pairs.append((self.taken, self.far_in))
            while self.taken - self._pairs[0][0] > self.window:
                self._pairs.popleft()
            self._fit()
        self._lows.append((self.taken, self.level()))
        while self.taken - self._lows[0][0] > LOW_WINDOW_S * self.rate:
            self._lows.popleft()
        if self.taken < self._next_servo:
            return
        self._next_servo = self.taken + int(SERVO_EVERY_S * self.rate)
        if self._pairs[-1][1] == self._far_seen:
            return                                     # no far end for a while: the speaker stopped
        self._far_seen = self._pairs[-1][1]
        low = min(v for _, v in self._lows)
        off = low - self.margin - self.bulk
        settled = self.taken - self._first > SETTLE_S * self.rate
        jump = JUMP_S if settled else 2 * DEADBAND_S           # at the start, straight to the margin
        if abs(off) > jump * self.rate and self._lows[0][0] < self.taken - 0.5 * self.rate:
            self.shift(off, why="the speaker's reference was off the microphone" if settled else None)
        else:
            self.servo.update((low - self.bulk) / self.rate)

    def _fit(self) -> None:
        """The far samples per reference sample over the pairs kept (least squares), once they span 1 s."""
        p = np.asarray(self._pairs, dtype=np.float64)
        if p[-1, 0] - p[0, 0] < self.rate:
            return
        t, f = p[:, 0] - p[:, 0].mean(), p[:, 1] - p[:, 1].mean()
        slope = float(np.dot(t, f) / np.dot(t, t))
        if 0.5 * self.nominal_step < slope < 2.0 * self.nominal_step:
            self.step_fit = slope

    def rescale(self, ratio: float) -> None:
        """The microphone path now makes ``1 / ratio`` times as many samples per second of its device (its
        rate was measured): far samples per reference sample scale by ``ratio``, and the fit starts over
        (pairs from before would bend it for its whole window)."""
        self.step_fit *= float(ratio)
        self._pairs.clear()
        if self._first is not None:
            self._first = self.taken             # settling again: the correction that follows is no event

    def set_bulk(self, samples: int) -> int:
        """Hold the reference back by ``samples`` (0 or more) from now: the part of the echo path's delay the
        canceller should not see. Returns the change (samples)."""
        samples = max(0, int(samples))
        change, self.bulk = samples - self.bulk, samples
        if change:
            self.shift(-change, why=None)
        return change

    def shift(self, samples: int, why: Optional[str] = "") -> None:
        """Move the pairing by ``samples`` reference samples: positive drops that many waiting (the reference
        gets newer), negative owes them (it gets older). One event line (none when ``why`` is None)."""
        samples = int(samples)
        if samples > 0:
            drop = min(samples, self._buf.size)
            self._buf = self._buf[drop:]
            self._debt += samples - drop
        elif samples < 0:
            pay = min(-samples, self._debt)
            self._debt -= pay
            self._buf = np.concatenate([np.zeros(-samples - pay, dtype=np.float32), self._buf])
        self._lows.clear()
        self.jumps += 1
        if why is not None:
            ms = 1000.0 * samples / self.rate
            self.events.append(f"{why}: re-aligned it by {ms:+.0f} ms" if why else
                               f"re-aligned the speaker's reference by {ms:+.0f} ms")
