"""The echo canceller watches itself: how much of the speaker's sound it takes out while the model speaks.

:class:`EchoHealth` reads every 10 ms frame the far end is active in and that was not passed as the user's
voice (no louder than the loudest echo the far end can give: engine/echo/canceller.py): the microphone's
energy, AEC3's output energy and the canceller's final output energy. Over the last 0.3 s of such frames
(``FAST``) AEC3's suppression tells within a few words that it lost the echo (a delay that jumped, a path
that changed, a state gone wrong): the canceller is then *suspect* — once ``confirm`` agrees that AEC3's output still holds the reference (the canceller asks its
phase transform over the last second, engine/echo/delay.py: the user talking over the speaker, which AEC3
rightly leaves in, holds none of it) — and its level gate holds echo-like frames down at once
(engine/echo/canceller.py); once that has lasted ``RECOVER_FRAMES`` of the model's speech a recovery is due:
the audio path re-aligns the reference to the measured delay and resets AEC3 (engine/echo/path.py; one event
line). The same frames over the last 3 s, less those the barge-in detector hears the user in and those with no
echo above the microphone's noise, give the suppression the app shows and records (the final output: what the
engine hears).

A microphone that hears no echo (headphones, a quiet path) is never suspect: a window whose microphone level
is within ``ECHO_ABOVE_DB`` of the level while the far end is silent has nothing to suppress.
"""
from __future__ import annotations

import collections
import math
from typing import Callable, Deque, Optional, Tuple

import numpy as np

#: frames (10 ms) of the model's speech read for the verdict and for the readout; the readout takes a frame
#: PENDING frames late (the barge-in detector confirms the user's talk within that)
FAST = 30
SLOW = 300
PENDING = 10
#: AEC3 taking less than this out over the fast window is suspect (dB); 6 dB more is healthy again
SUSPECT_DB = 15.0
#: a suspect state this long (frames of the model's speech) calls for a recovery; none again for COOLDOWN
RECOVER_FRAMES = 50
COOLDOWN_FRAMES = 300
#: the microphone must be this far above its level in silence for the window to hold echo (dB)
ECHO_ABOVE_DB = 10.0
#: a low suppression is confirmed (the output still holds the reference) at most this often (frames)
CONFIRM_EVERY = 20


def _db(power: float) -> float:
    return 10.0 * math.log10(power) if power > 1e-20 else -200.0


class EchoHealth:
    """``frame(near_e, aec_e, out_e, far_active, user, talking)`` per 10 ms frame (energies: sums of squares;
    ``user``: the canceller passed it as the user's voice; ``talking``: the barge-in detector hears the user
    now, which the readout leaves out).

    ``suspect``: AEC3 lost the echo (the fast window, confirmed); ``trusted``: the fast window last said AEC3
    clearly works (SUSPECT_DB + 6 dB or more out; any window under SUSPECT_DB, confirmed or not, ends it);
    ``due()``: a recovery should happen now (then ``recovered()``); ``suppression_db()``: the final output's
    suppression over the slow window.
    """

    def __init__(self, confirm: Optional[Callable[[], bool]] = None) -> None:
        self._confirm = confirm          # whether the output still holds the echo (asked before suspecting)
        self._asked_at = -CONFIRM_EVERY
        self._frames = 0
        self._fast: Deque[Tuple[float, float]] = collections.deque(maxlen=FAST)   # (near, AEC3 out)
        self._slow: Deque[Tuple[float, float]] = collections.deque(maxlen=SLOW)   # (near, final out)
        self._quiet: Deque[float] = collections.deque(maxlen=200)                  # near dB, far silent
        self._floor: Optional[float] = None
        self._pending: Deque[Tuple[float, float]] = collections.deque()   # readout frames not yet taken
        self.suspect = False
        self.trusted = False             # AEC3 was last seen clearly working (the guard may let it be)
        self.suspect_frames = 0          # frames of the model's speech in the current suspect stretch
        self._cooldown = 0
        self.recoveries = 0
        self.worst_db: Optional[float] = None   # AEC3's fast suppression when the last recovery became due

    def frame(self, near_e: float, aec_e: float, out_e: float, far_active: bool, user: bool,
              talking: bool = False) -> None:
        if not far_active:
            self._quiet.append(_db(near_e))
            if len(self._quiet) % 20 == 0 or self._floor is None:
                self._floor = float(np.median(self._quiet))
            return
        if user:
            return
        self._fast.append((near_e, aec_e))
        self._read(near_e, out_e, talking)
        self._cooldown = max(0, self._cooldown - 1)
        self._frames += 1
        lost = self._lost()
        if lost is not None:
            self.trusted = not lost                       # unconfirmed: the guard is the safe side
        if lost and not self.suspect and self._confirm is not None:
            if self._frames - self._asked_at < CONFIRM_EVERY:
                lost = None
            else:
                self._asked_at = self._frames
                lost = True if self._confirm() else None     # no echo in the output: the user's voice
        if lost is not None:
            self.suspect = lost
        self.suspect_frames = self.suspect_frames + 1 if lost else 0 if lost is False else self.suspect_frames

    def _read(self, near_e: float, out_e: float, talking: bool) -> None:
        """The readout's frames: held ``PENDING`` frames first, and dropped when the barge-in detector then hears
        the user (it confirms a talk 20-40 ms into it: the talk's first frames are the user's too)."""
        if talking:
            self._pending.clear()
            return
        self._pending.append((near_e, out_e))
        while len(self._pending) > PENDING:
            self._slow.append(self._pending.popleft())

    def _floor_db(self) -> float:
        """The microphone's level while the far end is silent (the median of the last 200 such frames)."""
        return -200.0 if self._floor is None else self._floor

    def _lost(self) -> Optional[bool]:
        """True: AEC3 took less than SUSPECT_DB out of the fast window; False: clearly more (6 dB over);
        None: no verdict (too few frames, nothing to suppress, or in between): the state stays as it was."""
        if len(self._fast) < FAST:
            return None
        near = sum(a for a, _ in self._fast)
        if _db(near / FAST) < self._floor_db() + ECHO_ABOVE_DB:
            return None                                   # nothing to suppress here
        removed = _db(near) - _db(sum(b for _, b in self._fast))
        return True if removed < SUSPECT_DB else False if removed >= SUSPECT_DB + 6.0 else None

    def fast_db(self) -> Optional[float]:
        if not self._fast:
            return None
        return _db(sum(a for a, _ in self._fast)) - _db(max(sum(b for _, b in self._fast), 1e-20))

    def clearly_healthy(self) -> bool:
        """AEC3 took at least SUSPECT_DB + 6 dB out over the fast window (full)."""
        return len(self._fast) == FAST and (self.fast_db() or 0.0) >= SUSPECT_DB + 6.0

    def due(self) -> bool:
        return self.suspect_frames >= RECOVER_FRAMES and self._cooldown == 0

    def recovered(self) -> None:
        """A recovery happened: start over (the canceller re-converges under its guard)."""
        self.worst_db = self.fast_db()
        self.recoveries += 1
        self._fast.clear()
        self._slow.clear()
        self._pending.clear()
        self.suspect, self.trusted, self.suspect_frames, self._cooldown = False, False, 0, COOLDOWN_FRAMES

    def suppression_db(self) -> Optional[float]:
        """The final output's suppression over the model's last 3 s of speech without the user (dB)."""
        floor = self._floor_db() + ECHO_ABOVE_DB          # frames with echo to suppress, not the room's noise
        frames = [(a, b) for a, b in self._slow if _db(a) >= floor]
        if not frames:
            return None
        return _db(sum(a for a, _ in frames)) - _db(max(sum(b for _, b in frames), 1e-20))
