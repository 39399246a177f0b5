"""Acoustic echo cancellation in the audio path: WebRTC's AEC3 through ``livekit``'s audio processing module.

The speaker's sound comes back through the microphone. :class:`EchoCanceller` is fed the exact signal the
speaker plays (:meth:`EchoCanceller.far`) and the microphone (:meth:`EchoCanceller.near`), and returns the
microphone with the model's voice removed. The processor is ``livekit.rtc.AudioProcessingModule`` (WebRTC's
AEC3 with noise suppression and a high-pass filter; chosen by measurement, see docs/echo.md). It takes 10 ms
frames of int16: this class cuts any chunk sizes into 10 ms frames (carrying the remainder to the next call),
converts float32 to int16 and back, and resamples with soxr where a rate has no whole 10 ms frame (22.05 kHz,
11.025 kHz): every rate that is a multiple of 100 Hz (16, 24, 32, 44.1, 48 kHz) goes to the module as it is,
which avoids soxr's round trip (up to 67 ms at its HQ setting, measured; the module resamples internally).
A convergence guard (:meth:`EchoCanceller._guard`) covers AEC3's first seconds, when it holds the user's
voice back or lets echo through (measured; docs/echo.md), and a double-talk check (engine/echo/doubletalk.py)
passes the user at the start of double talk, when AEC3 holds the near end back at any time.

``near`` returns exactly as many samples as it was given: the output runs one 10 ms frame (less one sample)
behind the input, whatever the chunk sizes, and the same samples in give the same samples out bit for bit.
Disabled, it passes the input through untouched. No Qt here.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Deque, Optional

import numpy as np

from engine.echo.delay import DelayTracker
from engine.echo.doubletalk import EchoLevelPredictor
from engine.echo.health import EchoHealth

#: far-end frames louder than this (dBFS) count as the model speaking, for :meth:`EchoCanceller.suppression_db`
FAR_ACTIVE_DB = -50.0
#: far-end audio kept waiting for its microphone frames at most (seconds); older far audio is dropped
FAR_MAX_S = 1.0
#: the recent far-active 10 ms frames the coupling estimate reads (3 s)
SUPPRESSION_FRAMES = 300
#: the rate a rate without whole 10 ms frames is resampled to
FALLBACK_RATE = 16000
#: While AEC3 converges (the first seconds of far-end speech, measured: it holds the near end back whole for
#: about 0.6 s, then lets 10-20 dB of echo through for a while) a guard helps it, for this much far-end activity
#: (see :meth:`EchoCanceller._guard`)
GUARD_S = 3.0
#: AEC3 also lets the first 40-100 ms of echo through when the speaker starts again after a silence (measured):
#: the guard's attenuation covers the first 300 ms (after the reported delay) of every far-end stretch too
ONSET_GUARD_FRAMES = 30
#: a microphone frame this much louder than the echo expected from the loudest recent far-end frame is the
#: user; a frame the processor took this much out of is mostly echo and is attenuated further
BYPASS_MARGIN_DB = 3.0
BYPASS_ABS_DB = -40.0
#: a microphone frame this much louder than the echo the far end one echo delay earlier can give
#: (:class:`engine.echo.doubletalk.EchoLevelPredictor`) is the user too, converged or not
DOUBLE_TALK_MARGIN_DB = 6.0
#: the double-talk check's lag more than this off a newly measured echo delay (ms) is stale: it learns afresh
STALE_LAG_MS = 20.0
#: the double-talk check learns the echo path from frames AEC3 took this much out of (echo alone, mostly)
ECHO_ONLY_DB = 10.0
ECHO_REMOVED_DB = 6.0
#: at the start of a far-end stretch (once past the first GUARD_S) a frame must stand this much more above the
#: loudest echo to pass as the user: the path may have got louder while the speaker was silent (measured: a
#: +6 dB ramp over a silence passed 200-300 ms of echo whole as "the user")
ONSET_MARGIN_DB = 6.0
#: the coupling estimate: this percentile of (microphone - loudest recent far end) over echo frames
COUPLING_PERCENTILE = 98
GUARD_ATTENUATION = 10.0 ** (-30.0 / 20.0)
FAR_WINDOW_MS = 300.0
#: the share of the reported delay handed to AEC3 as its stream delay. Measured (docs/echo.md): AEC3's own
#: delay estimator found every path of 30-250 ms with a hint of 0, while a hint at or above the true delay
#: cost up to 20 dB of ERLE and let echo through at the start of replies; 0 is the default for that reason
DELAY_HINT_FRACTION = 0.0


class EchoUnavailable(RuntimeError):
    """Echo cancellation cannot run here (the message says what to install, or to turn it off)."""


def _db(power: float) -> float:
    return 10.0 * math.log10(power) if power > 1e-20 else -200.0


class LivekitProcessor:
    """WebRTC's audio processing module as ``livekit`` ships it: AEC3, noise suppression, high-pass filter
    (automatic gain control off: it would change the level the voice-activity decisions read)."""

    name = "livekit.rtc.AudioProcessingModule (WebRTC AEC3 + NS + HPF)"

    def __init__(self, rate: int, noise_suppression: bool = True):
        try:                                   # the package, or its native library (a bundle without it), may fail
            from livekit import rtc
        except Exception as e:
            raise EchoUnavailable(f"echo cancellation needs the livekit package ({e}); install it with "
                                  f"pip install 'livekit>=1.0,<2', or turn echo cancellation off") from None
        self._rtc = rtc
        self.rate = int(rate)
        self.frame = self.rate // 100
        self._ns = bool(noise_suppression)
        self.delay_ms = 0
        self.reset()

    def set_delay_ms(self, ms: int) -> None:
        self.delay_ms = int(ms)

    def reset(self) -> None:
        """A fresh module: AEC3 forgets its filters and its delay estimate."""
        self.apm = self._rtc.AudioProcessingModule(echo_cancellation=True, noise_suppression=self._ns,
                                                   high_pass_filter=True, auto_gain_control=False)

    def _frame(self, x: np.ndarray):
        return self._rtc.AudioFrame(bytearray(x.tobytes()), self.rate, 1, self.frame)

    def reverse(self, x: np.ndarray) -> None:
        """One 10 ms int16 frame of what the speaker plays."""
        self.apm.process_reverse_stream(self._frame(x))

    def capture(self, x: np.ndarray) -> np.ndarray:
        """One 10 ms int16 frame of the microphone -> the same frame with the echo removed."""
        f = self._frame(x)
        self.apm.set_stream_delay_ms(self.delay_ms)     # WebRTC reads the delay with every capture frame
        self.apm.process_stream(f)
        return np.frombuffer(f.data, dtype=np.int16).copy()


def _to_int16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1.0, 32767.0 / 32768.0) * 32768.0).round().astype(np.int16)


class _Resampler:
    """soxr's streaming resampler, or nothing when the rates agree."""

    def __init__(self, rate_in: int, rate_out: int):
        self.stream = None
        if rate_in != rate_out:
            import soxr
            self.stream = soxr.ResampleStream(rate_in, rate_out, 1, dtype="float32", quality="HQ")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x if self.stream is None else self.stream.resample_chunk(x)


class EchoCanceller:
    """The microphone with the speaker's sound removed (WebRTC AEC3), float32 in and out at ``rate``.

    ``far(chunk)``: what the speaker plays, as it is played (call it before the microphone samples of the
    same moment). ``near(chunk)``: microphone samples -> as many cleaned samples (10 ms behind). ``set_delay_ms``:
    the speaker-to-microphone latency the audio layer reports (output + input latency): it sizes the window
    of the convergence guard, and ``hint_fraction`` of it goes to AEC3 as its stream delay (0 by default:
    AEC3 estimates the delay itself, which measured best).
    ``suppression_db()``: near-in vs near-out energy over the recent frames while the far end was active.
    ``enabled`` may change at any time; disabled, ``near`` returns its input as it is. ``double_talk``
    (True): the guard's double-talk check (:mod:`engine.echo.doubletalk`), which passes the user over the
    speaker without waiting for AEC3 and gates AEC3's residual echo.
    """

    def __init__(self, rate: int, enabled: bool = True, delay_ms: float = 0.0, noise_suppression: bool = True,
                 processor=None, hint_fraction: float = DELAY_HINT_FRACTION):
        self.rate = int(rate)
        if self.rate < 8000:
            raise ValueError(f"echo cancellation needs audio at 8 kHz or more; got {self.rate} Hz")
        self.proc_rate = self.rate if self.rate % 100 == 0 else FALLBACK_RATE
        self._processor = processor
        self._ns = noise_suppression
        self.frame = self.proc_rate // 100
        self.far_dropped = 0          # far samples (processor rate) dropped: far audio with no microphone
        self.far_missing = 0          # microphone frames processed with no far audio (played as silence)
        self._delay_ms = float(delay_ms)
        self.hint_fraction = float(hint_fraction)
        self._far_db: Deque[float] = collections.deque(maxlen=1)
        self.far_active_s = 0.0       # seconds of far-end activity the processor has seen
        self.bypassed = 0             # guard: frames passed as they were (the user over the speaker)
        self.guarded = 0              # guard: frames attenuated further (mostly echo)
        self._stretch = 0             # 10 ms frames since the far end became active
        self._coupling: Deque[float] = collections.deque(maxlen=SUPPRESSION_FRAMES)   # near dB - far max dB
        self.double_talk = True       # the double-talk check (the predicted echo level) is on
        self._predictor = EchoLevelPredictor()
        self._residual = DelayTracker(self.proc_rate, window_s=1.0)
        self.health = EchoHealth(confirm=self._residual.coherent)   # AEC3 while the model speaks: suspect, due
        self.resets = 0               # recoveries that reset AEC3
        self.double_talked = 0        # guard: frames passed by the double-talk check alone
        self.user_talking = False     # the caller's barge-in detector hears the user (the readout skips it)
        self._lag_doubted = False     # the double-talk check's lag disagrees with the delay last estimated
        self.hold_guard = False       # the caller is about to recover it: the guard works as at the start, and
        #                               the double-talk check (its echo path stale) passes nothing, as while suspect
        self._echo_like = False       # the newest frame is no louder than the echo predicted (+ the margin)
        self.cpu_s = 0.0              # wall seconds spent in the processor
        self.audio_s = 0.0            # seconds of microphone audio it processed
        self._enabled = False
        self.enabled = enabled

    # -- settings ----------------------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        on = bool(on)
        if on and self._processor is None:
            self._processor = LivekitProcessor(self.proc_rate, self._ns)
        if on and not self._enabled:
            self._reset_streams()
        self._enabled = on

    @property
    def processor_name(self) -> str:
        return getattr(self._processor, "name", type(self._processor).__name__) if self._processor else "off"

    def set_delay_ms(self, ms: float) -> None:
        """The speaker-to-microphone latency the audio layer reports (ms, >= 0)."""
        if not math.isfinite(ms) or ms < 0:
            raise ValueError(f"the echo delay is a latency in ms (0 or more); got {ms}")
        self._delay_ms = float(ms)
        frames = int(math.ceil((ms + FAR_WINDOW_MS) / 10.0))
        self._far_db = collections.deque(list(self._far_db)[-frames:], maxlen=frames)
        if self._processor is not None:
            self._processor.set_delay_ms(int(round(ms * self.hint_fraction)))

    @property
    def delay_ms(self) -> float:
        """The speaker-to-microphone latency last reported (ms)."""
        return self._delay_ms

    def _reset_streams(self) -> None:
        self._to_proc_far = _Resampler(self.rate, self.proc_rate)
        self._to_proc_near = _Resampler(self.rate, self.proc_rate)
        self._from_proc = _Resampler(self.proc_rate, self.rate)
        self._far = np.zeros(0, dtype=np.float32)
        self._near = np.zeros(0, dtype=np.float32)
        # the output runs a frame (less one sample, at the caller's rate) behind, so every call can answer
        self._predictor = EchoLevelPredictor()
        self._residual = DelayTracker(self.proc_rate, window_s=1.0)   # AEC3's output against the reference
        self.health = EchoHealth(confirm=self._residual.coherent)
        self._out = np.zeros(max(0, math.ceil(self.frame * self.rate / self.proc_rate) - 1), dtype=np.float32)
        if self.proc_rate != self.rate:
            self._out = np.zeros(self._out.size + self.rate // 20, dtype=np.float32)   # soxr's own delay
        self.set_delay_ms(self._delay_ms)

    # -- audio ---------------------------------------------------------------------------------------------
    def far(self, chunk: np.ndarray) -> None:
        """What the speaker plays now (float32 mono at ``rate``)."""
        if not self._enabled:
            return
        x = self._to_proc_far(np.ascontiguousarray(chunk, dtype=np.float32).reshape(-1))
        self._far = np.concatenate([self._far, x])
        over = self._far.size - int(FAR_MAX_S * self.proc_rate)
        if over > 0:
            self._far, self.far_dropped = self._far[over:], self.far_dropped + over

    def near(self, chunk: np.ndarray) -> np.ndarray:
        """Microphone samples -> the same number of samples with the echo removed (float32)."""
        x = np.ascontiguousarray(chunk, dtype=np.float32).reshape(-1)
        if not self._enabled:
            return x
        t0 = time.perf_counter()
        self._near = np.concatenate([self._near, self._to_proc_near(x)])
        n = self._near.size // self.frame
        cleaned = [self._frame(self._near[i * self.frame:(i + 1) * self.frame]) for i in range(n)]
        self._near = self._near[n * self.frame:]
        if cleaned:
            self._out = np.concatenate([self._out, self._from_proc(np.concatenate(cleaned))])
        out = np.zeros(x.size, dtype=np.float32)
        take = min(x.size, self._out.size)
        out[x.size - take:] = self._out[:take]          # short only while soxr fills (fallback rates)
        self._out = self._out[take:]
        self.cpu_s += time.perf_counter() - t0
        self.audio_s += x.size / self.rate
        return out

    def _frame(self, near: np.ndarray) -> np.ndarray:
        f = self.frame
        if self._far.size >= f:
            far, self._far = self._far[:f], self._far[f:]
        else:
            far, self._far = np.zeros(f, dtype=np.float32), np.zeros(0, dtype=np.float32)
            self.far_missing += 1
        self._processor.reverse(_to_int16(far))
        out = self._processor.capture(_to_int16(near)).astype(np.float32) / np.float32(32768.0)
        far_db = _db(float(np.mean(np.square(far, dtype=np.float64))))
        self._far_db.append(far_db)
        if far_db > FAR_ACTIVE_DB:
            self.far_active_s += 0.01
        passed = self.bypassed
        self._residual.listen(far, out)
        final = self._guard(near, out)
        self.health.frame(float(np.sum(np.square(near, dtype=np.float64))),
                          float(np.sum(np.square(out, dtype=np.float64))),
                          float(np.sum(np.square(final, dtype=np.float64))),
                          max(self._far_db) > FAR_ACTIVE_DB, self.bypassed != passed, self.user_talking)
        return final

    def _guard(self, near: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The convergence guard, on each 10 ms frame while the far end is active (its loudest frame over the
        reported delay plus 300 ms). AEC3 holds the near end back whole at first (the user's voice included)
        and at times later: a microphone frame :data:`BYPASS_MARGIN_DB` louder than the loudest echo that far
        end can give (its level plus :meth:`coupling_db`) is the user talking over the speaker, and passes as
        it is. AEC3 also lets echo through while it converges and when the speaker starts again: in the first
        :data:`GUARD_S` of far-end activity and the first 300 ms (after the reported delay) of every far-end
        stretch, a frame it took :data:`ECHO_REMOVED_DB` or more out of, or one no louder than that echo, is
        mostly echo and is attenuated 30 dB more. A level gate: all echo removal is AEC3's."""
        far_max = max(self._far_db, default=-200.0)
        near_db = _db(float(np.mean(np.square(near, dtype=np.float64))))
        out_db = _db(float(np.mean(np.square(out, dtype=np.float64))))
        talk = self._double_talk(near_db, echo_only=near_db - out_db >= ECHO_ONLY_DB)
        talk = talk and not (self.hold_guard or self.health.suspect or self._lag_doubted)   # a stale echo path
        if far_max <= FAR_ACTIVE_DB:
            self._stretch = 0
            return out
        self._stretch += 1
        onset = self._stretch <= ONSET_GUARD_FRAMES + self._delay_ms / 10.0
        talk = talk and not onset        # the path may have moved while the speaker was silent: no lag to trust
        echo_db = far_max + self.coupling_db()           # the loudest echo the far end can give now
        margin = BYPASS_MARGIN_DB + (ONSET_MARGIN_DB if onset and self.far_active_s >= GUARD_S else 0.0)
        if near_db > max(BYPASS_ABS_DB, echo_db + margin) or talk:
            self.bypassed += 1
            self.double_talked += int(near_db <= max(BYPASS_ABS_DB, echo_db + margin))
            return near.copy()
        self._coupling.append(near_db - far_max)         # the user's frames (passed above) stay out of it
        removed = near_db - out_db
        settled = self.far_active_s >= GUARD_S and not onset
        if settled and self.health.trusted and not (self.health.suspect or self.hold_guard):
            if self._echo_like and removed >= ECHO_REMOVED_DB:    # AEC3's residual echo, as predicted
                self.guarded += 1
                return out * np.float32(GUARD_ATTENUATION)
            return out
        if removed >= ECHO_REMOVED_DB or near_db <= echo_db:
            self.guarded += 1
            return out * np.float32(GUARD_ATTENUATION)
        return out

    def _double_talk(self, near_db: float, echo_only: bool) -> bool:
        """Whether this microphone frame is :data:`DOUBLE_TALK_MARGIN_DB` above the echo predicted from the far
        end one echo delay earlier (:class:`EchoLevelPredictor`). It learns from the frames AEC3 took
        :data:`ECHO_ONLY_DB` or more out of (AEC3's judgement, not this check's: a wrong estimate cannot
        keep itself)."""
        pred = self._predictor.predicted_db() if self.double_talk else None
        self._predictor.push(self._far_db[-1] if self._far_db else -200.0, near_db, usable=echo_only)
        self._echo_like = pred is not None and near_db <= pred + DOUBLE_TALK_MARGIN_DB
        return pred is not None and near_db > max(BYPASS_ABS_DB, pred + DOUBLE_TALK_MARGIN_DB)

    def coupling_db(self) -> float:
        """The echo path's coupling as the guard sees it: the 98th percentile of microphone level minus the
        loudest recent far-end level over the far-active frames it did not pass as the user's (0 dB, the
        loudest echo possible, before 0.3 s)."""
        if len(self._coupling) < 30:
            return 0.0
        return min(0.0, float(np.percentile(np.asarray(self._coupling), COUPLING_PERCENTILE)))

    # -- readouts -------------------------------------------------------------------------------------------
    def suppression_db(self) -> Optional[float]:
        """Echo suppression over the model's last 3 s of speech, frames passed as the user's voice left out:
        10 log10(near-in / near-out energy), dB; None before any such frame (or while disabled)."""
        if not self._enabled:
            return None
        return self.health.suppression_db()

    def delay_estimated(self, delay_ms: float) -> None:
        """A fresh estimate of the echo path's delay (every half second, engine/echo/delay.py): while the
        double-talk check's lag is more than 20 ms off it, the check passes nothing (a stale lag takes the echo
        for the user)."""
        lag = self._predictor.lag
        self._lag_doubted = lag is not None and abs(lag * 10.0 - delay_ms) > STALE_LAG_MS

    def delay_moved(self, delay_ms: float) -> bool:
        """The echo path's delay was measured anew (engine/echo/delay.py): where the double-talk check's lag is
        more than 20 ms off it, the check forgets its path and learns it again (a stale lag takes the echo for
        the user and passes it whole). Returns whether it did."""
        lag = self._predictor.lag
        if lag is None or abs(lag * 10.0 - delay_ms) <= STALE_LAG_MS:
            return False
        self._predictor = EchoLevelPredictor()
        self._lag_doubted = False
        return True

    def recover(self) -> None:
        """Start AEC3 over (its filters and delay estimate forgotten) with the guard armed as at the start: the
        convergence guard covers its first seconds again; the double-talk check learns the path anew."""
        reset = getattr(self._processor, "reset", None)
        if reset is not None:
            reset()
        self._predictor = EchoLevelPredictor()
        self._coupling.clear()
        self.far_active_s, self._stretch = 0.0, 0
        self._residual.restart()
        self.health.recovered()
        self.resets += 1

    def cost(self) -> float:
        """The processor's wall time as a share of the audio it processed (0.01 = 1 % of real time)."""
        return self.cpu_s / self.audio_s if self.audio_s > 0 else 0.0
