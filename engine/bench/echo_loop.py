"""The long echo bench's loop: a session second by second, the app's audio path block by block, simulated
devices callback by callback, all on one simulated true time (engine/bench/echo_devices.py).

What runs is the product's code: :class:`engine.echo.path.AudioPath` (what the app's frame pump does with
each microphone block), :class:`engine.echo.playout.Playback` and the speaker's :class:`Primed` queue, and
the engine's :class:`DuplexSession`. The loop stands in for the threads: the speaker's and the microphone's
callbacks at their devices' own pace, the pump waking after each microphone block (a little late, and now
and then held up for 50-250 ms, as a worker sharing a process with an engine is), and the engine taking a
modelled time per second (``compute_ms``: listening / speaking) before its answer is queued.

:class:`Tally` keeps, per simulated minute, what the report needs; the truth (where the user talked, what the
echo was) comes from the simulation, never from the product's own readouts, which are reported beside it.
"""
from __future__ import annotations

import collections
import heapq
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from engine.bench.echo_devices import VOICE_RATE, Clocks, PathSchedule, Room, minute_of
from engine.echo.path import AudioPath
from engine.echo.playout import ENGINE_RATE, Playback
from engine.session import DuplexSession, SessionConfig

#: a played 20 ms block louder than this (dBFS) is the model speaking; an echo block this loud is echo
SPEECH_DB = -45.0
ECHO_DB = -55.0
#: a barge-in fired this long after a turn's end still belongs to it (the detector's quiet time)
AFTER_TURN_S = 0.55


def _db(power: float) -> float:
    return 10.0 * np.log10(power + 1e-12)


@dataclass
class Minute:
    """One simulated minute's counts and sums."""

    mic_energy: float = 0.0          # microphone energy (x seconds) in echo-only blocks
    clean_energy: float = 0.0        # what the path handed the engine in the same blocks
    echo_s: float = 0.0              # seconds of such blocks
    self_interrupts: int = 0         # the engine stopped its reply for "user speech" with the user silent
    echo_heard_s: int = 0            # seconds the engine heard "user speech" with the user silent
    barge_ins: int = 0
    false_barge_ins: int = 0         # barge-ins fired with no user turn
    dropped_speech_s: float = 0.0
    flushed_s: float = 0.0
    spoken_s: float = 0.0            # seconds the engine spoke
    mic_to_speaker_s: List[float] = field(default_factory=list)
    reply_gaps_s: List[float] = field(default_factory=list)
    readout_db: List[float] = field(default_factory=list)    # the canceller's own suppression readout


class Tally:
    """Per-minute truth, filled by the loop: the user's turns (true time), when the path's samples were
    captured, when the speaker sounded speech."""

    def __init__(self, turns_s: List[Tuple[float, float]]):
        self.turns = turns_s
        self.minutes: Dict[int, Minute] = collections.defaultdict(Minute)
        self._samples: List[int] = [0]               # path output samples so far, at each pump block ...
        self._times: List[float] = [0.0]             # ... and the capture time of the block's last sample
        self.speech: List[List[float]] = []          # [start, end] of each stretch the speaker sounded speech

    def user_near(self, a: float, b: float, before: float = 0.15, after: float = 0.3) -> bool:
        """A user turn overlaps [a - after, b + before]: its start before ``b + before``, its end after
        ``a - after`` (the detector's and the canceller's frames lag the voice a little)."""
        return any(x < b + before and y > a - after for x, y in self.turns)

    def mark(self, samples: int, t: float) -> None:
        self._samples.append(samples)
        self._times.append(t)

    def time_of(self, sample: int) -> float:
        """True capture time of the path's ``sample``-th output sample (interpolated)."""
        return float(np.interp(sample, self._samples[-4000:], self._times[-4000:]))

    def played(self, t: float, dur: float, loud: bool) -> None:
        """The speaker sounds a block from ``t`` for ``dur``; ``loud``: speech."""
        if not loud:
            return
        if self.speech and self.speech[-1][1] >= t - 0.025:
            self.speech[-1][1] = t + dur
        else:
            self.speech.append([t, t + dur])

    def reply_gaps(self, end_s: float) -> List[Tuple[float, float]]:
        """(turn end, gap) for each turn the model answered after it, the speaker quiet at the turn's end: the
        first speech it sounded after the end and before the user's next turn."""
        starts = np.asarray([a for a, _ in self.speech])
        out = []
        for i, (_, b) in enumerate(self.turns):
            nxt = self.turns[i + 1][0] if i + 1 < len(self.turns) else end_s
            if any(a <= b <= z for a, z in self.speech):
                continue                              # the model was speaking when the user stopped
            later = starts[(starts >= b) & (starts < nxt)] if starts.size else starts
            if later.size:
                out.append((b, float(later[0] - b)))
        return out


@dataclass
class LoopConfig:
    """One run of the loop."""

    seconds: int
    cancel: bool
    clocks: Clocks
    path: PathSchedule
    voice: np.ndarray
    turns: List[Tuple[int, int]]
    seed: int = 0
    delay_s: float = 0.5                    # the session's playback delay
    compute_ms: Tuple[float, float] = (100.0, 470.0)   # the engine's time per listening / speaking second
    echo: bool = True                       # the speaker is heard by the microphone (False: headphones)
    tail: str = "mimi"
    quiet: bool = True


class Loop:
    """The simulated session: devices, the app's audio path, the engine."""

    def __init__(self, lc: LoopConfig):
        self.lc = lc
        self.out, self.mic = lc.clocks.devices(lc.delay_s)
        self.room = Room(self.out, self.mic, lc.path, lc.voice, lc.seed, echo=lc.echo)
        self.playback = Playback(self.out)
        self.path = AudioPath(self.mic, ENGINE_RATE, self.playback, echo=lc.cancel)
        turns_s = [(a / VOICE_RATE, b / VOICE_RATE) for a, b in lc.turns]
        self.tally = Tally(turns_s)
        self.rng = np.random.default_rng(lc.seed + 7)
        cfg = SessionConfig(tail=lc.tail, backbone="synthetic", size="tiny", device="cpu", seed=lc.seed).resolved()
        self.session = DuplexSession(cfg)
        self._events: list = []
        self._seq = 0
        self._parts: List[np.ndarray] = []       # path output not yet framed
        self._pending = 0
        self._frames = 0
        self._engine_free = 0.0
        self._busy_until = 0.0
        self._parts_meta: collections.deque = collections.deque()   # (n mic samples, echo power sum, user?)
        self._seen_starts = set()
        self._path_samples = 0
        self._dropped = (0, 0)                   # the queue's dropped speech and flushed samples, last seen
        self.records = []
        self.events: List[Tuple[float, str]] = []          # (true time, line) of the path's events but barge-ins
        self.readouts: List[Tuple[float, Optional[float]]] = []

    # -- scheduling -------------------------------------------------------------------------------------
    def _at(self, t: float, kind: str, data=None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, data))

    def run(self) -> "Loop":
        from engine.stats import progress
        self.session.start()
        end = float(self.lc.seconds)
        self._at(0.0, "out")
        self._at(0.0005, "mic")
        with progress(self.lc.seconds, desc=f"echo {'on' if self.lc.cancel else 'off'}", unit="s",
                      quiet=self.lc.quiet) as bar:
            shown = 0
            while self._events:
                t, _, kind, data = heapq.heappop(self._events)
                if t > end + 3.0:
                    break
                getattr(self, f"_on_{kind}")(t, data, end)
                if int(t) > shown and int(t) <= self.lc.seconds:
                    bar.update(int(t) - shown)
                    shown = int(t)
        self.session.close()
        return self

    # -- devices -----------------------------------------------------------------------------------------
    def _on_out(self, t: float, _data, end: float) -> None:
        before = (self.out.count, self.out.queue.played)
        block = self.out.callback(t)
        self.room.played(t, block)
        dac = self.room.t0_out + (self.out.count - block.size) / (self.out.rate * self.out.speed)
        self.tally.played(dac, self.out.period_s, _db(float(np.mean(np.square(block, dtype=np.float64)))) > SPEECH_DB)
        self._starts(before)
        if t < end + 2.0:
            self._at(t + self.out.period_s * (1.0 + 2e-4 * self.rng.standard_normal()), "out")

    def _starts(self, before: Tuple[int, int]) -> None:
        """Where each second's answer began to play in this callback (``before``: the device's and the queue's
        sample counts when it began): mic->speaker, the end of its input second to its sound."""
        for second, pos in list(self.out.queue.starts):
            if second in self._seen_starts or second < 0:
                continue
            self._seen_starts.add(second)
            at = before[0] + pos - before[1]               # the device's sample where it began
            sounded = self.room.t0_out + at / (self.out.rate * self.out.speed)
            ended = self.tally.time_of((second + 1) * ENGINE_RATE)
            self.tally.minutes[minute_of(sounded)].mic_to_speaker_s.append(sounded - ended)

    def _on_mic(self, t: float, _data, end: float) -> None:
        x, echo, user, times = self.room.capture(t)
        self._parts_meta.append((x.size, float(np.sum(np.square(echo))), times[-1]))
        if t < end:
            self._at(t + self.mic.period_s, "mic")
            self._at(t + self.rng.uniform(0.0, self.lc.clocks.pump_jitter_s), "pump")

    # -- the frame pump ----------------------------------------------------------------------------------
    def _on_pump(self, t: float, _data, end: float) -> None:
        if t < self._busy_until:
            return                                    # this wake-up is lost; the one at busy_until reads it all
        if self.rng.uniform() < self.lc.clocks.stalls_per_min / 60.0 * self.mic.period_s:
            self._busy_until = t + self.rng.uniform(*self.lc.clocks.stall_s)
            self._at(self._busy_until, "pump")
            return
        block = self.mic.ring.read()
        if block.size == 0:
            return
        n_in, echo_e, last_t = 0, 0.0, t
        while self._parts_meta and n_in < block.size:
            n, e, last_t = self._parts_meta.popleft()
            n_in, echo_e = n_in + n, echo_e + e
        far = self.path.drain_far()
        fired = self.path.barge_ins
        x = self.path.process(block, far)
        while self.path.events:                           # drained, as the app's window drains them
            kind, text = self.path.events.popleft()
            if kind != "barge-in":
                self.events.append((round(last_t, 2), f"{kind}: {text}"))
        self._account(block, x, echo_e, last_t, fired)
        self._frame(x, t)

    def _account(self, block: np.ndarray, x: np.ndarray, echo_e: float, last_t: float, fired: int) -> None:
        tl = self.tally
        first_t = last_t - block.size / (self.mic.rate * self.mic.speed)
        m = tl.minutes[minute_of(last_t)]
        self._path_samples += x.size
        tl.mark(self._path_samples, last_t)
        for _ in range(self.path.barge_ins - fired):
            m.barge_ins += 1
            m.false_barge_ins += int(not tl.user_near(first_t, last_t, before=0.0, after=AFTER_TURN_S))
        if x.size and _db(echo_e / max(1, block.size)) > ECHO_DB and not tl.user_near(first_t, last_t):
            dur_in, dur_out = block.size / self.mic.rate, x.size / ENGINE_RATE
            m.mic_energy += float(np.mean(np.square(block, dtype=np.float64))) * dur_in
            m.clean_energy += float(np.mean(np.square(x, dtype=np.float64))) * dur_out
            m.echo_s += dur_in

    def _frame(self, x: np.ndarray, t: float) -> None:
        self._parts.append(x)
        self._pending += x.size
        while self._pending >= ENGINE_RATE:
            buf = np.concatenate(self._parts)
            frame, rest = buf[:ENGINE_RATE], buf[ENGINE_RATE:]
            self._parts, self._pending = [rest], rest.size
            self._submit(frame, t)

    # -- the engine and the controller ------------------------------------------------------------------
    def _submit(self, frame: np.ndarray, t: float) -> None:
        k = self._frames
        self._frames += 1
        audio, rec = self.session.process(frame)
        listen, speak = self.lc.compute_ms
        ms = (speak if rec.decision == "speak" else listen) * self.rng.uniform(0.9, 1.1)
        start = max(t, self._engine_free)
        self._engine_free = start + ms / 1000.0
        self._at(self._engine_free, "result", (k, audio, rec))

    def _on_result(self, t: float, data, end: float) -> None:
        k, audio, rec = data
        self.records.append(rec)
        tl = self.tally
        a, b = tl.time_of(k * ENGINE_RATE), tl.time_of((k + 1) * ENGINE_RATE)
        m = tl.minutes[minute_of(b)]
        prev = self.records[-2] if len(self.records) > 1 else None
        alone = not tl.user_near(a, b, before=0.05, after=0.05)
        if rec.user_speech and alone:
            m.echo_heard_s += 1
            if prev is not None and prev.decision == "speak" and rec.decision != "speak":
                m.self_interrupts += 1
        m.spoken_s += float(rec.decision == "speak")
        c = self.path.canceller
        sup = c.suppression_db() if c is not None and c.enabled else None
        if sup is not None and rec.decision == "speak":
            m.readout_db.append(sup)
        counts = self.out.queue.counts
        m.dropped_speech_s += (counts.dropped_speech_samples - self._dropped[0]) / self.out.rate
        m.flushed_s += (counts.flushed_samples - self._dropped[1]) / self.out.rate
        self._dropped = (counts.dropped_speech_samples, counts.flushed_samples)
        if self.path.allows(k):
            self.playback.push(audio, k)
