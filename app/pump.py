"""The frame pump: the worker thread between the microphone ring and the engine.

It waits on the input source's ring, applies the push-to-talk gate, measures the input level,
detects barge-in (the user starts talking while model *speech* is queued — queued silence does not
count — after at least ``BARGE_IN_QUIET_S`` of quiet, so pauses between words are not new onsets:
the queued playback is flushed), resamples to 24 kHz with a streaming resampler, cuts one-second frames and hands each
to ``submit`` (``LiveRunner.submit``, which never blocks). No Qt here: the controller polls the
pump's counters from a GUI timer.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, Deque, Optional

import numpy as np

from app.audio_io import (ENGINE_RATE, SILENCE_DB, FrameAssembler, InputSource, Playback, StreamResampler,
                          block_db as level_db)

#: input level (dBFS) above which a rising edge counts as the user starting to talk
BARGE_IN_DB = -35.0
#: quiet (seconds) the user must leave before a new rising edge counts: gaps between words do not
BARGE_IN_QUIET_S = 0.5


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
        self.model_speaking = False      # the latest second's decision was "speak" (shown, not used to flush)
        self.level_db = SILENCE_DB       # latest block, before the gate
        self.submitted = 0
        self.error: Optional[str] = None  # set when the worker died (what broke, one line)
        self.events: Deque[tuple] = collections.deque(maxlen=1000)
        self.barge_ins = 0
        self._was_voiced = False
        self._quiet_s = float("inf")     # seconds of unvoiced input since the last voiced block
        self.on_block: Optional[Callable[[np.ndarray, int], None]] = None   # (gated block, rate): the scope
        self.on_frame: Optional[Callable[[int], None]] = None               # (frame index) at submit: latency

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
        """The worker loop. Any failure ends it with ``error`` set (one line naming the input);
        the controller's timer sees it and stops the session."""
        try:
            while not self._halt.is_set():
                self._maybe_switch()
                src = self._source
                if not src.ring.wait(0.05):
                    continue
                self.process(src.ring.read())
        except Exception as e:  # noqa: BLE001 - any failure is reported, never a silent dead thread
            self.error = f"the input stopped: {self._source.label}: {e}"

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
        self._barge_in(gate_open and self.level_db > self.barge_in_db, len(block) / self._source.rate)
        if self.on_block is not None:
            self.on_block(block, self._source.rate)
        for frame in self._frames.push(self._resampler.process(block)):
            if self.done:
                break
            if self.on_frame is not None:
                self.on_frame(self.submitted)
            self._submit(frame)
            self.submitted += 1

    def _barge_in(self, voiced: bool, block_s: float) -> None:
        """A rising edge after enough quiet, while real speech is queued, flushes the playback."""
        onset = voiced and not self._was_voiced and self._quiet_s >= BARGE_IN_QUIET_S
        self._was_voiced = voiced
        self._quiet_s = 0.0 if voiced else self._quiet_s + block_s
        if onset:
            self._flush_speech("user started talking")

    def _flush_speech(self, why: str) -> None:
        pb = self.playback
        if pb is None or pb.speech_queued_s() <= 0:
            return                       # nothing but silence queued: the model is not speaking
        dropped = pb.flush()
        self.barge_ins += 1
        self.events.append(("barge-in", f"{why}: flushed {dropped:.2f} s of playback"))

    def press_talk(self, pressed: bool) -> None:
        """Push-to-talk key state. Pressing (a key-down edge, not a repeat) while the model speaks is a
        barge-in too."""
        edge = bool(pressed) and not self.talking
        self.talking = bool(pressed)
        if edge and self.push_to_talk:
            self._flush_speech("push-to-talk pressed")

