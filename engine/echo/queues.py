"""A bounded delay: the speaker's queue and the engine's input queue never build a backlog.

:class:`PlaybackQueue` holds the model's speech on its way to the speaker. It never holds more than the
session's playback delay plus ``slack_s`` (one second): when playback (a device playing slower than real
time) or the engine (a burst of late seconds) falls behind, the late speech at its head is dropped and the
queue resyncs to the playback delay, as moshi's client does; what it dropped is counted (samples, speech
samples, events). An empty queue while the session runs is a playback gap (counted: events and samples).

:class:`RingBuffer` is the bounded sample FIFO between an audio callback and a worker thread (a source's
microphone samples, the speaker's played samples that the echo canceller reads).

:class:`InputBacklog` holds the one-second input frames waiting for the engine: at most ``max_frames``; a
new frame over that drops the oldest, counted. Both are thread-safe (an audio callback pops, a worker
pushes) and import no Qt.
"""
from __future__ import annotations

import collections
import math
import threading
from dataclasses import dataclass
from typing import Deque, Dict, Optional, Tuple

import numpy as np

#: 20 ms pieces louder than this (dBFS) are speech, when counting what was dropped
SPEECH_DB = -45.0
#: the level of an empty or all-zero block (dBFS)
SILENCE_DB = -120.0


def block_db(x: np.ndarray) -> float:
    """RMS level of a block in dBFS (SILENCE_DB for an empty or all-zero block)."""
    if len(x) == 0:
        return SILENCE_DB
    rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))
    return max(SILENCE_DB, 20.0 * math.log10(rms)) if rms > 0 else SILENCE_DB


@dataclass
class QueueCounts:
    """What a :class:`PlaybackQueue` did so far (samples at its rate)."""

    dropped_samples: int = 0        # late audio dropped to resync
    dropped_speech_samples: int = 0  # of which speech (20 ms pieces above SPEECH_DB)
    drop_events: int = 0
    flushed_samples: int = 0        # dropped by barge-ins (flush), not late
    skipped_samples: int = 0        # queued silence skipped to keep the delay (no speech was queued)
    gap_events: int = 0             # the speaker asked for audio and the queue ran dry
    gap_samples: int = 0

    def as_ms(self, rate: int) -> Dict[str, float]:
        ms = 1000.0 / rate
        return {"dropped_ms": self.dropped_samples * ms, "dropped_speech_ms": self.dropped_speech_samples * ms,
                "drop_events": self.drop_events, "flushed_ms": self.flushed_samples * ms,
                "skipped_ms": self.skipped_samples * ms,
                "gap_events": self.gap_events, "gap_ms": self.gap_samples * ms}


def _speech_samples(x: np.ndarray, piece: int) -> int:
    """Samples of ``x`` in 20 ms pieces louder than :data:`SPEECH_DB`."""
    if x.size == 0:
        return 0
    n = -(-x.size // piece)
    padded = np.zeros(n * piece, dtype=np.float64)
    padded[:x.size] = x
    level = 10.0 * np.log10(np.mean(padded.reshape(n, piece) ** 2, axis=1) + 1e-12)
    sizes = np.full(n, piece)
    sizes[-1] = x.size - (n - 1) * piece
    return int(sizes[level > SPEECH_DB].sum())


class PlaybackQueue:
    """The speaker's queue: at most ``delay_s + slack_s`` of audio; late audio is dropped, counted.

    ``push(chunk, second)``: the engine's audio for input second ``second`` (float32 at ``rate``); a push that
    would pass the cap drops the oldest audio so ``delay_s`` remains queued before the new chunk's end.
    ``pop(n)``: exactly ``n`` samples for the device (zeros where the queue ran dry: a gap, once the
    session has pushed anything). ``flush()``: drop everything (a barge-in). ``starts``: (second, sample
    position in the played stream) where each pushed second began to play (the mic->speaker readout).
    """

    def __init__(self, rate: int, delay_s: float = 0.0, slack_s: float = 1.0):
        if delay_s < 0 or slack_s <= 0:
            raise ValueError(f"the playback delay must be 0 s or more and the slack positive; got {delay_s}, {slack_s}")
        self.rate = int(rate)
        self.piece = max(1, self.rate // 50)
        self.delay_s, self.slack_s = float(delay_s), float(slack_s)
        self.counts = QueueCounts()
        self.played = 0                       # samples handed to the device (gaps included)
        self.starts: Deque[Tuple[int, int]] = collections.deque(maxlen=256)
        self._chunks: Deque[list] = collections.deque()   # [samples, second, started]
        self._n = 0
        self._pushed = False
        self._lock = threading.Lock()

    @property
    def cap(self) -> int:
        """The most samples the queue may hold."""
        return int(round((self.delay_s + self.slack_s) * self.rate))

    def set_delay(self, delay_s: float) -> None:
        """The session's playback delay (seconds), from the next push."""
        if delay_s < 0:
            raise ValueError(f"the playback delay must be 0 s or more; got {delay_s}")
        with self._lock:
            self.delay_s = float(delay_s)

    def queued_s(self) -> float:
        return self._n / self.rate

    def push(self, chunk: np.ndarray, second: int = -1) -> int:
        """Queue the engine's audio of input second ``second``; returns the samples dropped to stay bounded."""
        x = np.array(chunk, dtype=np.float32).reshape(-1)
        with self._lock:
            self._pushed = True
            self._chunks.append([x, int(second), False])
            self._n += x.size
            over = self._n - self.cap
            if over <= 0:
                return 0
            target = max(0, self._n - x.size - int(round(self.delay_s * self.rate)))   # resync to delay_s
            drop = min(self._n, max(over, target))
            self._drop(drop)
            self.counts.dropped_samples += drop
            self.counts.drop_events += 1
            return drop

    def skip_silence(self, n: int) -> int:
        """Remove the ``n`` oldest samples, which the caller knows are silence (counted as skipped, not as
        dropped); returns how many went."""
        with self._lock:
            n = min(int(n), self._n)
            speech = self.counts.dropped_speech_samples
            self._drop(n)
            self.counts.dropped_speech_samples = speech
            self.counts.skipped_samples += n
            return n

    def _drop(self, n: int) -> None:
        """Remove the ``n`` oldest samples (counting the speech among them)."""
        while n > 0 and self._chunks:
            head = self._chunks[0]
            take = min(n, head[0].size)
            self.counts.dropped_speech_samples += _speech_samples(head[0][:take], self.piece)
            head[0] = head[0][take:]
            n -= take
            self._n -= take
            if head[0].size == 0:
                self._chunks.popleft()

    def pop(self, n: int) -> np.ndarray:
        """Exactly ``n`` samples for the speaker (zeros where nothing is queued)."""
        out = np.zeros(int(n), dtype=np.float32)
        with self._lock:
            got = 0
            while got < n and self._chunks:
                head = self._chunks[0]
                if not head[2]:
                    head[2] = True
                    self.starts.append((head[1], self.played + got))
                take = min(n - got, head[0].size)
                out[got:got + take] = head[0][:take]
                head[0] = head[0][take:]
                got += take
                self._n -= take
                if head[0].size == 0:
                    self._chunks.popleft()
            if got < n and self._pushed:
                self.counts.gap_events += 1
                self.counts.gap_samples += n - got
            self.played += int(n)
        return out

    def flush(self) -> int:
        """Drop everything queued (a barge-in); returns the samples dropped."""
        with self._lock:
            n, self._n = self._n, 0
            self._chunks.clear()
            self.counts.flushed_samples += n
        return n


class InputBacklog:
    """The input frames waiting for the engine: at most ``max_frames``; the oldest are dropped, counted.

    ``push(frame)`` returns how many frames it dropped to stay bounded; ``pop()`` the oldest frame or None.
    """

    def __init__(self, max_frames: int = 2):
        if max_frames < 1:
            raise ValueError(f"the input backlog holds at least one frame; got {max_frames}")
        self.max_frames = int(max_frames)
        self.dropped_frames = 0
        self.drop_events = 0
        self._frames: Deque[Tuple[int, np.ndarray]] = collections.deque()
        self._next = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._frames)

    def push(self, frame: np.ndarray) -> int:
        with self._lock:
            self._frames.append((self._next, frame))
            self._next += 1
            over = len(self._frames) - self.max_frames
            for _ in range(max(0, over)):
                self._frames.popleft()
            if over > 0:
                self.dropped_frames += over
                self.drop_events += 1
            return max(0, over)

    def pop(self) -> Optional[Tuple[int, np.ndarray]]:
        """(the frame's index among all pushed, the frame), oldest first; None when empty."""
        with self._lock:
            return self._frames.popleft() if self._frames else None


class RingBuffer:
    """Bounded float32 FIFO between one producer thread and one consumer thread.

    ``write`` never blocks: when full, the oldest samples are dropped and counted in ``dropped``
    (samples) and ``overflows`` (writes that had to drop).
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("ring buffer capacity must be at least 1 sample")
        self._buf = np.zeros(int(capacity), dtype=np.float32)
        self._start = 0
        self._count = 0
        self._cond = threading.Condition()
        self.dropped = 0
        self.overflows = 0

    @property
    def capacity(self) -> int:
        return len(self._buf)

    def __len__(self) -> int:
        return self._count

    def write(self, x: np.ndarray) -> int:
        """Append samples; returns how many old samples were dropped to make room."""
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        cap = len(self._buf)
        if len(x) > cap:
            x = x[-cap:]
        with self._cond:
            over = max(0, self._count + len(x) - cap)
            self._start = (self._start + over) % cap
            self._count -= over
            self.dropped += over
            self.overflows += over > 0
            end = (self._start + self._count) % cap
            first = min(len(x), cap - end)
            self._buf[end:end + first] = x[:first]
            self._buf[:len(x) - first] = x[first:]
            self._count += len(x)
            self._cond.notify_all()
        return over

    def read_into(self, out: np.ndarray) -> int:
        """Move up to ``len(out)`` samples into ``out`` (1-D); returns how many were moved."""
        with self._cond:
            n = min(len(out), self._count)
            cap = len(self._buf)
            first = min(n, cap - self._start)
            out[:first] = self._buf[self._start:self._start + first]
            out[first:n] = self._buf[:n - first]
            self._start = (self._start + n) % cap
            self._count -= n
        return n

    def read(self, n: Optional[int] = None) -> np.ndarray:
        """Remove and return up to ``n`` samples (all queued samples when ``n`` is None)."""
        out = np.empty(self._count if n is None else min(n, self._count), dtype=np.float32)
        k = self.read_into(out)
        return out[:k]

    def clear(self) -> int:
        """Drop everything queued; returns how many samples were dropped."""
        with self._cond:
            n, self._count, self._start = self._count, 0, 0
        return n

    def wait(self, timeout: float) -> bool:
        """Block the calling (worker) thread until samples are queued or ``timeout`` passes."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count > 0, timeout)
