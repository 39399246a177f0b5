"""A bounded delay (engine/echo/queues.py): a speaker slower than real time, or an engine that falls behind,
never lets the mic -> speaker delay grow past the playback delay plus 1.5 s; the input backlog stays at two
frames. Simulated clocks: ten minutes in well under a second, no sleeping."""
from __future__ import annotations

import heapq

import numpy as np
import pytest

from engine.echo import InputBacklog, PlaybackQueue

RATE = 8000
BLOCK = RATE // 50                   # the device asks for 20 ms at a time


def speech(second: int) -> np.ndarray:
    """One second of the model's speech (about -20 dBFS), different every second."""
    return (np.random.default_rng(second).standard_normal(RATE) * 0.1).astype(np.float32)


def simulate(q: PlaybackQueue, minutes: float = 10.0, speed: float = 0.9, compute_s=lambda k: 0.3):
    """The engine pushes second k's answer at k + 1 + compute; the device plays at ``speed`` x real time.
    Returns the mic -> speaker delay of every second that played (s)."""
    seconds = int(minutes * 60)
    events = [(k + 1 + compute_s(k), 0, k) for k in range(seconds)]        # (time, kind 0 = push, second)
    period = BLOCK / RATE / speed
    events += [(i * period, 1, i) for i in range(int(seconds / period))]    # kind 1 = a device callback
    heapq.heapify(events)
    delays = {}
    while events:
        t, kind, k = heapq.heappop(events)
        if kind == 0:
            q.push(speech(k), second=k)
            continue
        before = q.played
        q.pop(BLOCK)
        while q.starts and q.starts[0][1] >= before:
            second, pos = q.starts.popleft()
            delays[second] = t + (pos - before) / RATE / speed - (second + 1)   # its input second ended at k + 1
        q.starts.clear()
    return delays


@pytest.mark.parametrize("delay_s", [0.0, 0.5, 1.0])
def test_speaker_at_90_percent_for_ten_minutes_stays_bounded(delay_s):
    q = PlaybackQueue(RATE, delay_s=delay_s)
    delays = simulate(q)
    assert len(delays) > 500
    assert max(delays.values()) <= delay_s + 1.5, max(delays.values())
    c = q.counts
    assert c.drop_events > 0 and c.dropped_samples > 0 and c.dropped_speech_samples > 0
    assert c.dropped_samples == pytest.approx(0.1 * 600 * RATE, rel=0.1)   # the 10 % the device could not play
    assert q.queued_s() <= delay_s + 1.0


def test_an_unbounded_queue_is_what_the_issue_saw():
    """The control: with no cap (the app's 30 s ring) the same simulation drifts tens of seconds behind."""
    delays = simulate(PlaybackQueue(RATE, delay_s=0.5, slack_s=3600.0))
    assert max(delays.values()) > 30.0


def test_an_engine_that_stalls_is_bounded_too():
    """Every 30 s the engine stalls for 5 s, then delivers the late seconds at once (real-time device)."""
    stall = lambda k: 0.3 + (5.0 - (k % 30) if k % 30 < 5 else 0.0)       # noqa: E731
    q = PlaybackQueue(RATE, delay_s=0.5)
    delays = simulate(q, speed=1.0, compute_s=stall)
    late = [d for k, d in delays.items() if k % 30 >= 5]
    assert max(late) <= 0.5 + 1.5
    assert q.counts.drop_events > 0 and q.counts.gap_events > 0           # the stall played as a gap


def test_gaps_flush_and_bad_settings():
    q = PlaybackQueue(RATE, delay_s=0.2)
    assert np.array_equal(q.pop(BLOCK), np.zeros(BLOCK, np.float32))
    assert q.counts.gap_events == 0                                        # nothing pushed yet: no gap
    q.push(speech(0)[:BLOCK * 2], second=0)
    a, b, c = q.pop(BLOCK), q.pop(BLOCK), q.pop(BLOCK)
    assert np.array_equal(np.concatenate([a, b]), speech(0)[:BLOCK * 2]) and not c.any()
    assert q.counts.gap_events == 1 and q.counts.gap_samples == BLOCK
    q.push(speech(1), second=1)
    assert q.flush() == RATE and q.counts.flushed_samples == RATE and q.queued_s() == 0
    assert q.counts.as_ms(RATE)["gap_ms"] == pytest.approx(20.0)
    with pytest.raises(ValueError, match="playback delay"):
        PlaybackQueue(RATE, delay_s=-1)


def test_input_backlog_with_a_slow_engine_stays_within_two_frames():
    """Frames arrive every second for ten minutes; the engine needs 1.25 s a frame."""
    backlog = InputBacklog(max_frames=2)
    arrivals, t_free, waits, pushed = {}, 0.0, [], 0
    for k in range(600):
        t = float(k + 1)
        while t_free <= t and len(backlog):                 # the engine takes frames while it is free
            idx, _ = backlog.pop()
            start = max(t_free, arrivals[idx])
            waits.append(start - arrivals[idx])
            t_free = start + 1.25
        arrivals[k] = t
        backlog.push(np.full(4, k, np.float32))
        pushed += 1
        assert len(backlog) <= 2
    assert max(waits) <= 2.5
    assert backlog.dropped_frames > 50 and backlog.drop_events > 0
    assert backlog.dropped_frames + len(waits) + len(backlog) == pushed
    with pytest.raises(ValueError):
        InputBacklog(0)
