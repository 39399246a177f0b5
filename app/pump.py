"""The frame pump: the worker thread between the microphone ring and the engine.

It waits on the input source's ring, applies the push-to-talk gate, measures the input level,
detects barge-in (the user starts talking while model speech is queued: the queued playback is
flushed), resamples to 24 kHz with a streaming resampler, cuts one-second frames and hands each
to ``submit`` (``LiveRunner.submit``, which never blocks). No Qt here: the controller polls the
pump's counters from a GUI timer.
"""
from __future__ import annotations

import collections
import math
import threading
from typing import Callable, Deque, Optional

import numpy as np

from app.audio_io import ENGINE_RATE, FrameAssembler, InputSource, Playback, StreamResampler

#: input level (dBFS) above which a rising edge counts as the user starting to talk
BARGE_IN_DB = -35.0
SILENCE_DB = -120.0


def level_db(x: np.ndarray) -> float:
    """RMS level of a block in dBFS (SILENCE_DB for an empty or all-zero block)."""
    if len(x) == 0:
        return SILENCE_DB
    rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))
    return max(SILENCE_DB, 20.0 * math.log10(rms)) if rms > 0 else SILENCE_DB


class FramePump(threading.Thread):
    """Worker thread: source ring -> gate -> 24 kHz -> one-second frames -> ``submit(frame)``.

    ``submitted`` counts the frames handed over. ``events`` is a deque of (kind, text) the GUI
    drains: "barge-in", "source".
    """

    def __init__(self, source: InputSource, submit: Callable[[np.ndarray], None],
                 playback: Optional[Playback] = None, barge_in_db: float = BARGE_IN_DB,
                 max_frames: Optional[int] = None):
        super().__init__(name="frame-pump", daemon=True)
        self._submit = submit
        self._source = source
        self._new_source: Optional[InputSource] = None
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._resampler = StreamResampler(source.rate, ENGINE_RATE)
        self._frames = FrameAssembler(ENGINE_RATE)
        self.playback = playback
        self.max_frames = max_frames     # stop submitting after this many frames (scripted runs)
        self.accepting = True            # False until the session is built: input is only metered
        self.barge_in_db = barge_in_db
        self.push_to_talk = False        # True: the mic is muted unless ``talking``
        self.talking = False             # Space held (push-to-talk)
        self.model_speaking = False      # the latest second's decision was "speak"
        self.level_db = SILENCE_DB       # latest block, before the gate
        self.submitted = 0
        self.events: Deque[tuple] = collections.deque(maxlen=1000)
        self.barge_ins = 0
        self._was_voiced = False

    # -- control (any thread) ------------------------------------------------------------
    @property
    def source(self) -> InputSource:
        return self._source

    def replace_source(self, source: InputSource) -> None:
        """Switch to another source at the next block (the frame in progress continues)."""
        with self._lock:
            self._new_source = source

    def halt(self, timeout: float = 1.0) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout)

    @property
    def done(self) -> bool:
        """True once ``max_frames`` frames were submitted."""
        return self.max_frames is not None and self.submitted >= self.max_frames

    # -- worker --------------------------------------------------------------------------
    def run(self) -> None:
        while not self._halt.is_set():
            self._maybe_switch()
            src = self._source
            if not src.ring.wait(0.05):
                continue
            self.process(src.ring.read())

    def _maybe_switch(self) -> None:
        with self._lock:
            new, self._new_source = self._new_source, None
        if new is None:
            return
        if new.rate != self._source.rate:
            self._resampler = StreamResampler(new.rate, ENGINE_RATE)
        self._source = new
        self.events.append(("source", f"input switched to {new.label}"))

    def process(self, block: np.ndarray) -> None:
        """Handle one block of native-rate samples (called on the worker thread; tests call it)."""
        self.level_db = level_db(block)
        if not self.accepting:
            return
        gate_open = self.talking or not self.push_to_talk
        if not gate_open:
            block = np.zeros_like(block)
        self._barge_in(gate_open and self.level_db > self.barge_in_db)
        for frame in self._frames.push(self._resampler.process(block)):
            if self.done:
                break
            self._submit(frame)
            self.submitted += 1

    def _barge_in(self, voiced: bool) -> None:
        onset = voiced and not self._was_voiced
        self._was_voiced = voiced
        pb = self.playback
        if onset and pb is not None and (self.model_speaking or pb.queued_s() > 0):
            dropped = pb.flush()
            self.barge_ins += 1
            self.events.append(("barge-in", f"user started talking: flushed {dropped:.2f} s of playback"))

    def press_talk(self, pressed: bool) -> None:
        """Push-to-talk key state. Pressing while the model speaks is a barge-in too."""
        self.talking = bool(pressed)
        if pressed and self.push_to_talk and self.playback is not None and self.playback.queued_s() > 0:
            dropped = self.playback.flush()
            self.barge_ins += 1
            self.events.append(("barge-in", f"push-to-talk pressed: flushed {dropped:.2f} s of playback"))

