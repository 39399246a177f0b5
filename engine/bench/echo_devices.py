"""Devices on clocks of their own, a room whose echo path changes, and a user who talks over the model: the
world the long echo bench (engine/bench/echo_long.py) runs the app's audio path in.

Everything runs on one simulated true time (seconds). The speaker consumes its queue in blocks at
``speed_out`` x its nominal rate; the sound it makes reaches the microphone ``delay_s(t)`` later and
``gain_db(t)`` louder through a short room response; the microphone samples that sound, the user's voice and
its own noise at ``speed_in`` x its nominal rate. Neither device knows the other's clock: a sample's place in
time is ``t0 + n / (nominal x speed)``. The echo is read from the speaker's samples at the microphone's sample
instants by band-limited (Lanczos, a = 12) interpolation — a different kernel from the product's resampler.

The user's voice is a 24 kHz signal on true time (:func:`conversation`): turns at seeded times, bursts of short
interruptions at given minutes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from engine.bench.echo_sim import room_response, user_voice
from engine.bench.session import speech_like
from engine.echo.playout import Primed
from engine.echo.queues import PlaybackQueue, RingBuffer

#: the user's voice is kept at this rate on true time
VOICE_RATE = 24000
#: the Lanczos kernel's half width (samples of the signal read)
LANCZOS_A = 12
MIC_NOISE = 5e-4                      # the microphone's own noise (about -66 dBFS)


#: the kernel tabulated at this many phases per sample (read with linear interpolation between phases)
LANCZOS_PHASES = 512


def _lanczos_table() -> np.ndarray:
    """[phases + 1, 2a]: the taps of a read at fraction j / phases past its base sample."""
    frac = np.arange(LANCZOS_PHASES + 1)[:, None] / LANCZOS_PHASES
    t = frac - np.arange(-LANCZOS_A + 1, LANCZOS_A + 1)[None, :]
    return np.sinc(t) * np.sinc(t / LANCZOS_A)


_TABLE = _lanczos_table()


def lanczos_read(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``x`` read at fractional sample positions ``pos`` (0 outside ``x``)."""
    out = np.zeros(pos.size)
    if x.size == 0:
        return out
    base = np.floor(pos).astype(np.int64)
    inside = (base + LANCZOS_A < x.size) & (base - LANCZOS_A + 1 >= 0)
    lo, hi = int(base.min()) - LANCZOS_A + 1, int(base.max()) + LANCZOS_A + 1
    if not inside.all():
        pad = np.zeros(hi - lo)
        a, b = max(lo, 0), min(hi, x.size)
        if b > a:
            pad[a - lo:b - lo] = x[a:b]
    else:
        pad = x[lo:hi]
    if not pad.any():
        return out
    f = (pos - base) * LANCZOS_PHASES
    i0 = np.minimum(f.astype(np.int64), LANCZOS_PHASES - 1)
    a = (f - i0)[:, None]
    w = _TABLE[i0] * (1.0 - a) + _TABLE[i0 + 1] * a
    windows = np.lib.stride_tricks.sliding_window_view(pad, 2 * LANCZOS_A)[base - LANCZOS_A + 1 - lo]
    return np.einsum("ij,ij->i", w, windows)


@dataclass
class PathSchedule:
    """The echo path over time: ``delay_ms`` and ``gain_db`` steps at given seconds, plus a slow sway.

    ``steps``: [(second, delay ms, gain dB)], the first at 0. A delay step is a jump (a device re-syncing
    its buffers); a gain step is a ramp over ``ramp_s`` (a hand on the volume, someone moving). Between steps
    the delay sways by ``sway_ms`` and the gain by ``sway_db`` (slow sines, periods of 97 s and 61 s)."""

    steps: Sequence[Tuple[float, float, float]]
    sway_ms: float = 0.0
    sway_db: float = 0.0
    ramp_s: float = 2.0

    def at(self, t: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(delay s, linear gain) at true times ``t``."""
        starts = np.asarray([s[0] for s in self.steps])
        i = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(self.steps) - 1)
        delay = np.asarray([s[1] for s in self.steps])[i] + self.sway_ms * np.sin(2 * np.pi * t / 97.0)
        gains = np.asarray([s[2] for s in self.steps])
        into = np.clip((t - starts[i]) / self.ramp_s, 0.0, 1.0) if self.ramp_s > 0 else 1.0
        gain = gains[np.maximum(i - 1, 0)] + (gains[i] - gains[np.maximum(i - 1, 0)]) * into
        gain = gain + self.sway_db * np.sin(2 * np.pi * t / 61.0)
        return delay / 1000.0, 10.0 ** (gain / 20.0)


def conversation(seconds: int, seed: int, bursts: Sequence[float] = (), burst_s: float = 30.0
                 ) -> Tuple[np.ndarray, List[Tuple[int, int]]]:
    """The user's voice at 24 kHz on true time and its turns [(first sample, end sample)]: the echo bench's
    turns (1.3-2.6 s, 2-5 s apart), and from each second in ``bursts`` for ``burst_s``: short interruptions
    (0.5-0.9 s, 2.0-2.6 s apart: each falls on the reply to the one before)."""
    x, turns = user_voice(seconds, seed, VOICE_RATE)
    rng = np.random.default_rng(seed + 104723)
    for start in bursts:
        a, b = int(start * VOICE_RATE), int(min(seconds, start + burst_s) * VOICE_RATE)
        for ta, tb in turns:
            if not (tb <= a or ta >= b):
                x[ta:tb] = 0.0                    # a turn the burst overlaps goes, all of it
        turns = [(ta, tb) for ta, tb in turns if tb <= a or ta >= b]
        x[a:b] = 0.0
        t = start
        while t + 1.0 < start + burst_s and t + 1.0 < seconds:
            n = int(rng.uniform(0.5, 0.9) * VOICE_RATE)
            s0 = int(t * VOICE_RATE)
            burst = speech_like(2, int(rng.integers(1 << 30)), VOICE_RATE)[:n].copy()
            burst[n - VOICE_RATE // 50:] *= np.linspace(1.0, 0.0, VOICE_RATE // 50, dtype=np.float32)
            x[s0:s0 + n] = burst
            turns.append((s0, s0 + n))
            t += n / VOICE_RATE + rng.uniform(2.0, 2.6)
    return x, sorted(turns)


class SimOutput(Primed):
    """The simulated speaker: a sink like the app's device output (``queue``, ``played``, ``latency_s``,
    ``clock``), whose callback the bench calls at the device's own pace."""

    def __init__(self, rate: int, speed: float, block: int, latency_s: float, delay_s: float):
        self.rate, self.speed, self.block = int(rate), float(speed), int(block)
        self.label = f"simulated speaker ({rate} Hz at {speed:g} x)"
        self.queue = PlaybackQueue(self.rate, delay_s)
        self.played = RingBuffer(self.rate * 4)
        self.latency_s = float(latency_s)
        self.count = 0
        self.clock: Optional[Tuple[float, int]] = None      # (time, samples consumed) at the last callback

    @property
    def period_s(self) -> float:
        return self.block / (self.rate * self.speed)

    def callback(self, t: float) -> np.ndarray:
        out = self.pop_primed(self.block)
        self.played.write(out)
        self.count += self.block
        self.clock = (t, self.count)
        return out


class SimInput:
    """The simulated microphone: a source like the app's device input (``rate``, ``ring``, ``latency_s``,
    ``clock``)."""

    def __init__(self, rate: int, speed: float, block: int, latency_s: float):
        self.rate, self.speed, self.block = int(rate), float(speed), int(block)
        self.label = f"simulated microphone ({rate} Hz at {speed:g} x)"
        self.ring = RingBuffer(self.rate * 8)
        self.latency_s = float(latency_s)
        self.count = 0
        self.clock: Optional[Tuple[float, int]] = None

    @property
    def period_s(self) -> float:
        return self.block / (self.rate * self.speed)


class Room:
    """What the microphone hears: the speaker's sound through the echo path, the user's voice, noise."""

    def __init__(self, out: SimOutput, mic: SimInput, path: PathSchedule, voice: np.ndarray, seed: int,
                 echo: bool = True):
        self.out, self.mic, self.path, self.voice, self.echo_on = out, mic, path, voice, bool(echo)
        self.h = room_response(seed, out.rate)
        self._played = np.zeros(0, dtype=np.float64)       # the speaker's samples, filtered by the room
        self._hist = np.zeros(self.h.size - 1, dtype=np.float64)
        self._first = 0                                    # index of self._played[0] in the speaker's stream
        self.t0_out: Optional[float] = None                # true time the speaker's first sample sounded
        self.t0_in: Optional[float] = None                 # true time the microphone took its first sample
        self.noise = np.random.default_rng(seed + 104729)

    def played(self, t: float, block: np.ndarray) -> None:
        """The speaker's callback at ``t`` filled ``block``: it sounds ``latency_s`` later."""
        if self.t0_out is None:
            self.t0_out = t + self.out.latency_s
        seg = np.concatenate([self._hist, block.astype(np.float64)])
        self._played = np.concatenate([self._played, np.convolve(seg, self.h, mode="valid")])
        self._hist = seg[-(self.h.size - 1):]
        keep = int(2.0 * self.out.rate)                    # the longest echo delay read back (2 s)
        if self._played.size > 2 * keep:
            cut = self._played.size - keep
            self._played, self._first = self._played[cut:], self._first + cut

    def capture(self, t: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The microphone's callback at ``t``: its next block -> (samples, echo part, user part, times)."""
        m = self.mic
        if self.t0_in is None:
            self.t0_in = t - m.latency_s - m.period_s
        times = self.t0_in + (m.count + np.arange(m.block)) / (m.rate * m.speed)
        user = lanczos_read(self.voice, times * VOICE_RATE) if times[0] * VOICE_RATE < self.voice.size \
            else np.zeros(m.block)
        echo = np.zeros(m.block)
        if self.echo_on and self.t0_out is not None:
            delay, gain = self.path.at(times)
            pos = (times - delay - self.t0_out) * self.out.rate * self.out.speed - self._first
            echo = gain * lanczos_read(self._played, pos)
        noise = self.noise.standard_normal(m.block) * MIC_NOISE
        x = (user + echo + noise).astype(np.float32)
        m.count += m.block
        m.clock = (t, m.count)
        m.ring.write(x)
        return x, echo, user, times


@dataclass
class Clocks:
    """The devices of one run: nominal rates, speeds, callback blocks, latencies (seconds)."""

    out_rate: int = 48000
    out_speed: float = 1.0
    out_block: int = 960
    out_latency_s: float = 0.04
    in_rate: int = 48000
    in_speed: float = 1.0
    in_block: int = 960
    in_latency_s: float = 0.02
    pump_jitter_s: float = 0.003          # the worker wakes up to this long after the input callback
    stalls_per_min: float = 6.0           # the worker is held up (the engine, the GIL) this often ...
    stall_s: Tuple[float, float] = (0.05, 0.25)   # ... for this long
    extra: dict = field(default_factory=dict)

    def devices(self, delay_s: float) -> Tuple[SimOutput, SimInput]:
        return (SimOutput(self.out_rate, self.out_speed, self.out_block, self.out_latency_s, delay_s),
                SimInput(self.in_rate, self.in_speed, self.in_block, self.in_latency_s))


def minute_of(t: float) -> int:
    return int(math.floor(t / 60.0))
