"""The audio path between the microphone and the engine, one block at a time (no threads, no Qt).

:class:`AudioPath` is what the app's frame pump (app/pump.py) does with each block of the microphone, and
what ``duplexcadence-bench echo`` drives with simulated devices: the same code for both.

* the block is resampled to the session's input rate (``rate``) at the microphone's measured rate (a source
  with a ``clock``, the (time, samples) its callback last stamped: :class:`engine.echo.clock.RateMeter`),
  so a microphone that runs fast or slow still hands the engine one second of audio per second;
* **echo cancellation** (:class:`engine.echo.EchoCanceller`, WebRTC AEC3): first the far end — exactly what
  the speaker played since the last block (``sink.played``, drained here), lined up with the microphone at
  its rate and clock by :class:`engine.echo.align.FarAligner` — then the microphone, which comes back with
  the speaker's sound removed. The canceller is told the speaker-to-microphone latency the audio layer
  reports (both streams' ``latency_s``);
* **barge-in in a blink** (:class:`engine.echo.BargeInDetector` on 20 ms frames of the cleaned microphone):
  the moment the user's speech starts over the model's speech, the queued playback is flushed (the speaker
  falls silent within the device's own latency) and speech the engine made from input up to that second is
  not played (:meth:`AudioPath.allows`); the engine follows at its next second.

``events`` is a deque of (kind, text) for the window's log: "barge-in", "echo".
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, Deque, Optional

import numpy as np
import soxr

from engine.echo.align import FarAligner
from engine.echo.bargein import BargeInDetector
from engine.echo.canceller import EchoCanceller, EchoUnavailable
from engine.echo.clock import RateMeter
from engine.echo.delay import MAX_LAG_MS, TARGET_MS, DelayTracker
from engine.echo.queues import SILENCE_DB, block_db
from engine.echo.replygap import ReplyGapMeter
from engine.echo.resample import VariableResampler

#: the interrupt sensitivity a session starts with (engine/echo/bargein.py SENSITIVITY)
DEFAULT_SENSITIVITY = "normal"
#: far-end (played) level above which the model counts as speaking now (dBFS)
PLAYING_DB = -45.0
#: a recovery waits at most this long (s) for the echo delay to be measured afresh
REMEASURE_S = 4.0
#: a measured delay this far (ms) from the one measured after the last recovery is a moved echo path: the
#: canceller is recovered unless it is clearly working (AEC3 may find a small move itself, slowly: 3-20 s
#: measured)
MOVED_MS = 30.0


class MicStream:
    """A source's samples -> ``rate``. A device (a source that stamps a ``clock``: the (time, samples) its
    callback last delivered) is resampled at its measured rate (:class:`engine.echo.clock.RateMeter`,
    :class:`engine.echo.resample.VariableResampler`); a file or silence at its nominal rate by soxr's stream,
    which gives the frames the engine's own reading of the file gives (engine/audio.py)."""

    def __init__(self, source, rate: int):
        self.rate = int(rate)
        self.nominal = float(source.rate)
        self.meter = RateMeter(self.nominal)
        self.follows = hasattr(source, "clock")
        self._rs = VariableResampler(self.nominal, self.rate) if self.follows else None
        self._soxr = (soxr.ResampleStream(self.nominal, self.rate, 1, dtype="float32", quality="HQ")
                      if not self.follows and self.nominal != self.rate else None)
        self.step = self.nominal / self.rate     # source samples per output sample, as last used

    def __call__(self, source, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if not self.follows:
            return x.copy() if self._soxr is None else self._soxr.resample_chunk(x)
        clock = getattr(source, "clock", None)
        if clock is not None:
            self.meter.stamp(*clock)
        self.step = self.meter.rate() / self.rate
        return self._rs.process(x, self.step)


class AudioPath:
    """Microphone blocks (at ``source.rate``) -> echo-cancelled samples at ``rate``, barge-ins on the way.

    ``source``: the input (``rate``, optional ``latency_s``); ``playback``: the model's speech on its way
    to a sink (:class:`engine.echo.playout.Playback`, None without a speaker). ``echo_wanted`` is the
    user's toggle: cancellation runs while wanted and a speaker plays (the canceller is built on first use).
    """

    def __init__(self, source, rate: int, playback=None, sensitivity: str = DEFAULT_SENSITIVITY,
                 echo: bool = True):
        self.rate = int(rate)
        self.source = source
        self._mic = MicStream(source, self.rate)
        self.events: Deque[tuple] = collections.deque(maxlen=1000)
        self.barge_ins = 0
        self.barge_in_ms: Deque[float] = collections.deque(maxlen=1000)   # latency of each, for the records
        self.gaps = ReplyGapMeter(self.rate)   # the reply gap of each turn (``gaps.gaps_ms``), for the records
        self._gaps_read = 0
        self.echo_wanted = bool(echo)
        self.echo_error: Optional[str] = None
        self.detector = BargeInDetector(self.rate, sensitivity=sensitivity)
        self._sensitivity: Optional[str] = None   # a change asked from another thread, taken on this one
        self._detector_lock = threading.Lock()
        self.canceller: Optional[EchoCanceller] = None
        self.aligner: Optional[FarAligner] = None
        self.tracker = DelayTracker(self.rate)   # the echo path's delay, measured (engine/echo/delay.py)
        self._lost: Optional[tuple] = None       # (samples waited, why): a recovery waiting for the delay
        self._settled_ms: Optional[float] = None  # the delay measured first since the last recovery (ms)
        self.far_db = SILENCE_DB         # the level the speaker played last
        self._playing_since: Optional[int] = None   # detector sample where the model's speech began playing
        self.playback = playback
        self.on_played: Optional[Callable[[np.ndarray, int], None]] = None  # (played block, rate): the scope

    @property
    def playback(self):
        return self._playback

    @playback.setter
    def playback(self, pb) -> None:
        self._playback = pb
        sink = getattr(pb, "sink", None)
        self.aligner = FarAligner(sink.rate, self.rate) if sink is not None else None

    def set_source(self, source) -> None:
        """Another input from the next block (its rate may differ)."""
        self._mic = MicStream(source, self.rate)
        self.source = source

    def set_sensitivity(self, sensitivity: str) -> None:
        """The interrupt sensitivity (engine/echo SENSITIVITY), from the next block."""
        with self._detector_lock:
            self._sensitivity = sensitivity

    def device_latency_ms(self) -> float:
        """Speaker-to-microphone latency the audio layer reports: output plus input stream latency (also what
        lies outside the path for a barge-in's and a reply's timing: spoken -> here, here -> sounded)."""
        sink = getattr(self._playback, "sink", None)
        out = getattr(sink, "latency_s", 0.0) if sink is not None else 0.0
        return 1000.0 * (float(out or 0.0) + float(getattr(self.source, "latency_s", 0.0) or 0.0))

    def _echo_on(self) -> bool:
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
        return True

    # -- per block ---------------------------------------------------------------------------------------
    def drain_far(self) -> np.ndarray:
        """What the speaker played since the last block, as it played it (empty without a speaker)."""
        sink = getattr(self._playback, "sink", None)
        played = getattr(sink, "played", None)
        if played is None or self.aligner is None:
            return np.zeros(0, dtype=np.float32)
        self._playback.observe()
        y = played.read()
        if len(y):
            self.far_db = block_db(y)
            if self.on_played is not None:
                self.on_played(y, sink.rate)
        return y

    def process(self, block: np.ndarray, far: np.ndarray) -> np.ndarray:
        """One block of the microphone (``source.rate``; zeros where push-to-talk mutes it) and the far end
        drained with it (:meth:`drain_far`) -> the cleaned block at ``rate``; barge-ins fire on the way."""
        before = self._mic.step
        x = self._mic(self.source, block)
        ref = None
        if self.aligner is not None:
            if abs(self._mic.step / before - 1.0) > 1e-3:        # the microphone's rate was (re)measured
                self.aligner.rescale(self._mic.step / before)
            self.aligner.push(far)
            ref = self.aligner.take(x.size)
            while self.aligner.events:
                self.events.append(("echo", self.aligner.events.pop(0)))
        if self._echo_on():
            self.tracker.push(ref, x)
            self.canceller.user_talking = self.detector.talking
            self.canceller.far(ref)
            x = self.canceller.near(x)
            self._keep_healthy(x.size)
        self._detect(x)
        if ref is not None:
            self.gaps.push(ref, self.detector, self.device_latency_ms() - 1000.0 * self.aligner.margin / self.rate)
        return x


    def _keep_healthy(self, n: int) -> None:
        """Recover the canceller by itself. When it lost the echo (its health), the delay is measured afresh
        (the canceller's guard holds the echo down meanwhile, at most :data:`REMEASURE_S`), then the reference
        is re-aligned to it and AEC3 reset, one event line; at once when a measured delay lies beyond AEC3's
        easy reach, or moved by more than :data:`MOVED_MS` while the canceller is not clearly working."""
        c, t = self.canceller, self.tracker
        far_ms = None if t.delay is None else 1000.0 * t.delay / self.rate
        told = max(self.device_latency_ms(), far_ms or 0.0, MAX_LAG_MS if self._lost is not None else 0.0)
        if told != c.delay_ms:
            c.set_delay_ms(told)
        if t.estimated:
            c.delay_estimated(1000.0 * t.candidate / self.rate)
        if t.changed and far_ms is not None:
            c.delay_moved(far_ms)
        if self._lost is None and c.health.due():
            self._lost = (0, f"echo cancellation lost the echo ({c.health.fast_db():.0f} dB over the model's last "
                             f"{c.health.suspect_frames / 100:.1f} s of speech)")
            t.restart()
            c.hold_guard = True
            return
        if self._lost is not None:
            waited, why = self._lost[0] + n, self._lost[1]
            self._lost = (waited, why)
            if far_ms is not None or waited > REMEASURE_S * self.rate:
                self._lost, c.hold_guard = None, False
                self._recover(far_ms, why)
        elif not t.changed or far_ms is None:
            pass
        elif far_ms > TARGET_MS + 100.0:         # AEC3's weak range (measured: seconds at 10-20 dB, with dips)
            self._recover(far_ms, f"the echo path's delay ({far_ms:.0f} ms) is long for AEC3")
        elif c.health.clearly_healthy():
            pass                                 # a working canceller is left alone
        elif self._settled_ms is not None and abs(far_ms - self._settled_ms) > MOVED_MS:
            self._recover(far_ms, f"the echo path's delay moved by {far_ms - self._settled_ms:+.0f} ms")
        if t.changed and far_ms is not None and self._settled_ms is None:
            self._settled_ms = far_ms

    def _recover(self, far_ms: Optional[float], why: str) -> None:
        self._settled_ms = None                  # the next measured delay is the new one to hold
        moved = 0
        if far_ms is not None:
            moved = self.aligner.set_bulk(self.aligner.bulk + int((far_ms - TARGET_MS) * self.rate / 1000.0))
            self.tracker.restart()
            self.tracker.ahead = self.aligner.bulk
        self.canceller.recover()
        how = f"re-aligned the reference by {1000.0 * moved / self.rate:+.0f} ms and reset" if moved else "reset"
        self.events.append(("echo", f"{why}: {how} the canceller"))

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
            self.flush_speech("user started talking", (b.fired_at - start) * 1000.0 / self.rate)

    def new_reply_gaps(self) -> list:
        """The reply gaps (ms) measured since the last call (the caller's records take them)."""
        k = min(self.gaps.measured - self._gaps_read, len(self.gaps.gaps_ms))
        self._gaps_read = self.gaps.measured
        return list(self.gaps.gaps_ms)[len(self.gaps.gaps_ms) - k:] if k > 0 else []

    def allows(self, frame_no: int) -> bool:
        """Whether the engine's speech made from input frame ``frame_no`` may play (after a barge-in, the
        seconds up to the user's onset are dropped; a later second releases the duck)."""
        with self._detector_lock:
            return self.detector.allows(frame_no)

    def flush_speech(self, why: str, detect_ms: float = 0.0) -> None:
        """A barge-in: drop the queued speech (nothing when only silence is queued), counted, one event."""
        pb = self._playback
        if pb is None or (pb.speech_queued_s() <= 0 and self.far_db <= PLAYING_DB):
            return                       # nothing but silence queued: the model is not speaking
        dropped = pb.flush()
        latency = detect_ms + self.device_latency_ms()
        self.barge_ins += 1
        self.barge_in_ms.append(latency)
        self.events.append(("barge-in", f"{why}: flushed {dropped:.2f} s of playback; silent "
                                        f"{latency:.0f} ms after the onset"))
