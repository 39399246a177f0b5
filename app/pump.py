"""The frame pump: the worker thread between the microphone ring and the engine.

It waits on the input source's ring, applies the push-to-talk gate, measures the input level, and hands each
block to the audio path (:class:`engine.echo.path.AudioPath`: the resampling to the session's input rate —
24 kHz, or 16 kHz for a MiniCPM-o 4.5 session, the stock's own input — echo cancellation against what the
speaker played, and barge-in in a blink), then cuts one-second frames of the cleaned microphone and hands
them to ``submit`` (``LiveRunner.submit``, never blocking).

No Qt here: the controller polls the pump's counters from a GUI timer. The audio callbacks only copy.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

import numpy as np

from app.audio_io import ENGINE_RATE, SILENCE_DB, FrameAssembler, InputSource, Playback, block_db as level_db
from engine.echo.path import DEFAULT_SENSITIVITY, AudioPath


class FramePump(threading.Thread):
    """Worker thread: source ring -> gate -> audio path (``rate``, echo cancelled, barge-in) -> one-second frames
    of ``rate`` samples -> ``submit(frame)``.

    ``submitted`` counts the frames handed over. ``events`` is a deque of (kind, text) the GUI
    drains: "barge-in", "echo", "source".
    """

    def __init__(self, source: InputSource, submit: Callable[[np.ndarray], None],
                 playback: Optional[Playback] = None, sensitivity: str = DEFAULT_SENSITIVITY,
                 max_frames: Optional[int] = None, echo: bool = True, rate: int = ENGINE_RATE):
        super().__init__(name="frame-pump", daemon=True)
        self.path = AudioPath(source, rate, playback, sensitivity, echo)
        self.rate = self.path.rate       # the session's input rate: frames, echo cancelling and barge-in run at it
        self._submit = submit
        self._source = source
        self._new_source: Optional[InputSource] = None
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._frames = FrameAssembler(self.rate)
        self.max_frames = max_frames     # stop submitting after this many frames (scripted runs)
        self.accepting = True            # False until the session is built: input is only metered
        self.push_to_talk = False        # True: the mic is muted unless ``talking``
        self.talking = False             # Space held (push-to-talk)
        self.model_speaking = False      # the latest second's decision was "speak" (shown, not used to flush)
        self.level_db = SILENCE_DB       # latest block, before the gate
        self.unheard_s = 0.0             # seconds of speech (above the barge-in threshold) before ``accepting``
        self.submitted = 0
        self.error: Optional[str] = None  # set when the worker died (what broke, one line)
        self.events = self.path.events
        self.on_block: Optional[Callable[[np.ndarray, int], None]] = None   # (cleaned block, rate): the scope
        self.on_frame: Optional[Callable[[int], None]] = None               # (frame index) at submit: latency

    # -- the audio path's state, under the pump's names ----------------------------------------------------
    playback = property(lambda self: self.path.playback, lambda self, pb: setattr(self.path, "playback", pb))
    echo_wanted = property(lambda self: self.path.echo_wanted,
                           lambda self, on: setattr(self.path, "echo_wanted", bool(on)))
    on_played = property(lambda self: self.path.on_played, lambda self, f: setattr(self.path, "on_played", f))
    canceller = property(lambda self: self.path.canceller)
    echo_error = property(lambda self: self.path.echo_error)
    detector = property(lambda self: self.path.detector)
    barge_ins = property(lambda self: self.path.barge_ins)
    barge_in_ms = property(lambda self: self.path.barge_in_ms)
    far_db = property(lambda self: self.path.far_db)

    def set_sensitivity(self, sensitivity: str) -> None:
        """The interrupt sensitivity (engine/echo SENSITIVITY), from the pump's next block."""
        self.path.set_sensitivity(sensitivity)

    def device_latency_ms(self) -> float:
        return self.path.device_latency_ms()

    def allows(self, frame_no: int) -> bool:
        """Whether the engine's speech made from input frame ``frame_no`` may play (after a barge-in, the
        seconds up to the user's onset are dropped; a later second releases the duck)."""
        return self.path.allows(frame_no)

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
        self.path.set_source(new)
        self._source = new
        self.events.append(("source", f"input switched to {new.label}"))

    def process(self, block: np.ndarray) -> None:
        """Handle one block of native-rate samples (called on the worker thread; tests call it)."""
        self.level_db = level_db(block)
        far = self.path.drain_far()
        if not self.accepting:
            if self.level_db > self.detector.abs_db:      # speech while the session is built: not heard
                self.unheard_s += len(block) / max(1, self._source.rate)
            return
        gate_open = self.talking or not self.push_to_talk
        if not gate_open:
            block = np.zeros_like(block)
        x = self.path.process(block, far)
        if self.on_block is not None:
            self.on_block(x, self.rate)
        for frame in self._frames.push(x):
            if self.done:
                break
            if self.on_frame is not None:
                self.on_frame(self.submitted)
            self._submit(frame)
            self.submitted += 1

    def playing(self) -> bool:
        """The model's speech is playing now (or queued to play)."""
        return self.path.playing()

    def _flush_speech(self, why: str, detect_ms: float = 0.0) -> None:
        self.path.flush_speech(why, detect_ms)

    def press_talk(self, pressed: bool) -> None:
        """Push-to-talk key state. Pressing (a key-down edge, not a repeat) while the model speaks is a
        barge-in too."""
        edge = bool(pressed) and not self.talking
        self.talking = bool(pressed)
        if edge and self.push_to_talk:
            self._flush_speech("push-to-talk pressed")
