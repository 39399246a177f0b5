"""The frame pump: the worker thread between the microphone ring and the engine.

It waits on the input source's ring, applies the push-to-talk gate, measures the input level, resamples
to the session's input rate (``rate``: 24 kHz, or 16 kHz for a MiniCPM-o 4.5 session, the stock's own input)
with a streaming resampler (nothing to do when the source already runs at it), and then works on that rate:

* **echo cancellation** (:class:`engine.echo.EchoCanceller`, WebRTC AEC3): first the far end — exactly
  what the output callback wrote to the speaker (``sink.played``, drained here, resampled to ``rate``, so
  the reference and the microphone line up sample for sample at whichever rate the session hears) —
  then the microphone, which comes back with the speaker's sound removed. The canceller is told the
  speaker-to-microphone latency the audio layer reports (both streams' ``latency``);
* **barge-in in a blink** (:class:`engine.echo.BargeInDetector` on 20 ms frames of the cleaned
  microphone): the moment the user's speech starts over the model's speech, the queued playback is
  flushed (the speaker falls silent within the device's own latency) and speech the engine made from
  input up to that second is not played (:meth:`FramePump.allows`); the engine follows at its next second;
* one-second frames of the cleaned microphone go to ``submit`` (``LiveRunner.submit``, never blocking).

No Qt here: the controller polls the pump's counters from a GUI timer. The audio callbacks only copy.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, Deque, List, Optional

import numpy as np

from app.audio_io import (ENGINE_RATE, SILENCE_DB, FrameAssembler, InputSource, Playback, StreamResampler,
                          block_db as level_db)
from engine.echo import BargeInDetector, EchoCanceller, EchoUnavailable

#: the interrupt sensitivity a session starts with (engine/echo/bargein.py SENSITIVITY)
DEFAULT_SENSITIVITY = "normal"
#: far-end (played) level above which the model counts as speaking now (dBFS)
PLAYING_DB = -45.0


class FramePump(threading.Thread):
    """Worker thread: source ring -> gate -> ``rate`` -> one-second frames of ``rate`` samples -> ``submit(frame)``.

    ``submitted`` counts the frames handed over. ``events`` is a deque of (kind, text) the GUI
    drains: "barge-in", "source".
    """

    def __init__(self, source: InputSource, submit: Callable[[np.ndarray], None],
                 playback: Optional[Playback] = None, sensitivity: str = DEFAULT_SENSITIVITY,
                 max_frames: Optional[int] = None, echo: bool = True, rate: int = ENGINE_RATE):
        super().__init__(name="frame-pump", daemon=True)
        self.rate = int(rate)            # the session's input rate: frames, echo cancelling and barge-in run at it
        self._submit = submit
        self._source = source
        self._new_source: Optional[InputSource] = None
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._resampler = StreamResampler(source.rate, self.rate)
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
        self.events: Deque[tuple] = collections.deque(maxlen=1000)
        self.barge_ins = 0
        self.barge_in_ms: Deque[float] = collections.deque(maxlen=1000)   # latency of each, for the records
        self.echo_wanted = bool(echo)    # the user's toggle; on only while a speaker plays (nothing to cancel)
        self.echo_error: Optional[str] = None
        self.detector = BargeInDetector(self.rate, sensitivity=sensitivity)
        self._sensitivity: Optional[str] = None   # a change asked from the GUI, taken on this thread
        self._detector_lock = threading.Lock()
        self.canceller: Optional[EchoCanceller] = None
        self._far_rs: Optional[StreamResampler] = None
        self.far_db = SILENCE_DB         # the level the speaker played last
        self._playing_since: Optional[int] = None   # detector sample where the model's speech began playing
        self.playback = playback
        self.on_block: Optional[Callable[[np.ndarray, int], None]] = None   # (cleaned block, rate): the scope
        self.on_played: Optional[Callable[[np.ndarray, int], None]] = None  # (played block, rate): the scope
        self.on_frame: Optional[Callable[[int], None]] = None               # (frame index) at submit: latency

    @property
    def playback(self) -> Optional[Playback]:
        return self._playback

    @playback.setter
    def playback(self, pb: Optional[Playback]) -> None:
        self._playback = pb
        sink = getattr(pb, "sink", None)
        self._far_rs = StreamResampler(sink.rate, self.rate) if sink is not None else None

    def _echo_on(self) -> bool:
        """Cancellation runs while wanted and a speaker plays (the canceller is built on first use)."""
        if not self.echo_wanted or self._playback is None or self.echo_error:
            if self.canceller is not None:
                self.canceller.enabled = False
            return False
        if self.canceller is None:
            try:
                self.canceller = EchoCanceller(self.rate)
            except EchoUnavailable as e:
                self.echo_error = str(e)
                self.events.append(("echo", str(e)))
                return False
        self.canceller.enabled = True
        self.canceller.set_delay_ms(self.device_latency_ms())
        return True

    def device_latency_ms(self) -> float:
        """Speaker-to-microphone latency the audio layer reports: output plus input stream latency."""
        sink = getattr(self._playback, "sink", None)
        out = getattr(sink, "latency_s", 0.0) if sink is not None else 0.0
        return 1000.0 * (float(out or 0.0) + float(getattr(self._source, "latency_s", 0.0) or 0.0))

    def set_sensitivity(self, sensitivity: str) -> None:
        """The interrupt sensitivity (engine/echo SENSITIVITY), from the pump's next block."""
        with self._detector_lock:
            self._sensitivity = sensitivity

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
            self._resampler = StreamResampler(new.rate, self.rate)
        self._source = new
        self.events.append(("source", f"input switched to {new.label}"))

    def process(self, block: np.ndarray) -> None:
        """Handle one block of native-rate samples (called on the worker thread; tests call it)."""
        self.level_db = level_db(block)
        far = self._drain_far()
        if not self.accepting:
            if self.level_db > self.detector.abs_db:      # speech while the session is built: not heard
                self.unheard_s += len(block) / max(1, self._source.rate)
            return
        gate_open = self.talking or not self.push_to_talk
        if not gate_open:
            block = np.zeros_like(block)
        x = self._resampler.process(block)
        if self._echo_on():
            self.canceller.far(far)
            x = self.canceller.near(x)
        self._detect(x)
        if self.on_block is not None:
            self.on_block(x, self.rate)
        for frame in self._frames.push(x):
            if self.done:
                break
            if self.on_frame is not None:
                self.on_frame(self.submitted)
            self._submit(frame)
            self.submitted += 1

    def _drain_far(self) -> np.ndarray:
        """What the speaker played since the last block, at ``rate`` (empty without a speaker)."""
        pb = self._playback
        sink = getattr(pb, "sink", None)
        played = getattr(sink, "played", None)
        if played is None or self._far_rs is None:
            return np.zeros(0, dtype=np.float32)
        y = played.read()
        if len(y):
            self.far_db = level_db(y)
            if self.on_played is not None:
                self.on_played(y, sink.rate)
        return self._far_rs.process(y)

    def playing(self) -> bool:
        """The model's speech is playing now (or queued to play)."""
        pb = self._playback
        return pb is not None and (self.far_db > PLAYING_DB or pb.speech_queued_s() > 0)

    def _detect(self, x: np.ndarray) -> None:
        playing = self.playing()
        with self._detector_lock:
            if self._sensitivity is not None:
                self.detector.set_sensitivity(self._sensitivity)
                self._sensitivity = None
            if playing and self._playing_since is None:
                self._playing_since = self.detector.pos      # the model started speaking here
            elif not playing:
                self._playing_since = None
            hits = self.detector.push(x, playing)
        for b in hits:
            # from the user's onset or, when the model started over a user already talking, from its start
            start = max(b.onset_at, self._playing_since if self._playing_since is not None else b.onset_at)
            self._flush_speech("user started talking", (b.fired_at - start) * 1000.0 / self.rate)

    def allows(self, frame_no: int) -> bool:
        """Whether the engine's speech made from input frame ``frame_no`` may play (after a barge-in, the
        seconds up to the user's onset are dropped; a later second releases the duck)."""
        with self._detector_lock:
            return self.detector.allows(frame_no)

    def _flush_speech(self, why: str, detect_ms: float = 0.0) -> None:
        pb = self._playback
        if pb is None or (pb.speech_queued_s() <= 0 and self.far_db <= PLAYING_DB):
            return                       # nothing but silence queued: the model is not speaking
        dropped = pb.flush()
        sink_latency = 1000.0 * float(getattr(pb.sink, "latency_s", 0.0) or 0.0)
        src_latency = 1000.0 * float(getattr(self._source, "latency_s", 0.0) or 0.0)
        latency = detect_ms + sink_latency + src_latency
        self.barge_ins += 1
        self.barge_in_ms.append(latency)
        self.events.append(("barge-in", f"{why}: flushed {dropped:.2f} s of playback; silent "
                                        f"{latency:.0f} ms after the onset"))

    def press_talk(self, pressed: bool) -> None:
        """Push-to-talk key state. Pressing (a key-down edge, not a repeat) while the model speaks is a
        barge-in too."""
        edge = bool(pressed) and not self.talking
        self.talking = bool(pressed)
        if edge and self.push_to_talk:
            self._flush_speech("push-to-talk pressed")
