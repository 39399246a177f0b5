"""Devices on their own clocks: the variable-ratio resampler, the rate meter, the echo reference lined up with
the microphone for good, and playback at the speaker's measured rate (engine/echo: resample, clock, align,
playout)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.echo.align import FarAligner
from engine.echo.clock import LevelServo, RateMeter
from engine.echo.playout import ENGINE_RATE, Playback, Primed
from engine.echo.queues import PlaybackQueue, RingBuffer
from engine.echo.resample import VariableResampler


def _sine(rate: float, f: float, n: int, start: float = 0.0) -> np.ndarray:
    return np.sin(2 * np.pi * f * (start + np.arange(n)) / rate)


def test_the_resampler_reads_a_sine_at_the_positions_it_reports_whatever_the_blocks_and_ratios():
    rng = np.random.default_rng(0)
    for rin, rout, f, want in ((24000, 48000 * 0.81, 9000, -70), (48000 * 1.2, 24000, 8000, -70),
                               (48000, 24000, 1000, -80)):
        x = _sine(rin, f, int(rin * 2))
        r = VariableResampler(rin, rout)
        out, pos, i = [], [], 0
        while i < x.size:
            b = int(rng.integers(50, 2000))
            step = r.nominal_step * (1 + 2e-3 * rng.standard_normal())       # the ratio moves every block
            p0 = r.position
            y = r.process(x[i:i + b], step)
            out.append(y)
            pos.append(p0 + step * np.arange(y.size))
            i += b
        y, p = np.concatenate(out)[300:-300], np.concatenate(pos)[300:-300]
        err = y - np.sin(2 * np.pi * f * p / rin)
        assert 10 * np.log10(np.mean(err ** 2) / 0.5) < want, (rin, rout, f)


def test_a_step_of_one_is_a_copy_without_delay_and_bad_steps_are_refused():
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    r = VariableResampler(24000, 24000)
    assert np.array_equal(np.concatenate([r.process(x[:333], 1.0), r.process(x[333:], 1.0)]), x)
    with pytest.raises(ValueError, match="positive"):
        r.process(x, 0.0)
    with pytest.raises(ValueError, match="positive rates"):
        VariableResampler(0, 24000)


def test_the_rate_meter_finds_a_slow_clock_through_jittery_callbacks():
    m = RateMeter(48000.0)
    rng = np.random.default_rng(2)
    count, t = 0, 0.0
    assert m.rate() == 48000.0                       # nominal until it has seen enough
    while t < 20.0:
        count += 960
        t += 960 / (48000 * 0.81)
        m.stamp(t + rng.uniform(0, 0.004), count)    # the callback runs a little late, by up to 4 ms
    assert m.speed() == pytest.approx(0.81, abs=2e-4)


def test_a_nominal_clock_seen_through_late_callbacks_stays_nominal():
    """Callbacks stamped up to 30 ms late over a 2-3 s fit put tenths of a percent into its slope; within three
    standard errors of the nominal rate the meter keeps the nominal one (a resampled nominal microphone
    records a stretched voice), and a real 0.5 % off is still found once the stamps show it."""
    for speed, want in ((1.0, 1.0), (1.005, 1.005)):
        m = RateMeter(44100.0)
        rng = np.random.default_rng(5)
        count, t, speeds = 0, 0.0, []
        while t < 30.0:
            count += 441
            t += 441 / (44100 * speed)
            m.stamp(t + rng.uniform(0, 0.03), count)
            if t > 2.0:
                speeds.append(m.speed())
        if want == 1.0:
            assert all(s == 1.0 for s in speeds), max(abs(s - 1.0) for s in speeds)
        else:
            assert m.speed() == pytest.approx(want, abs=3e-4)


def test_the_servo_drains_a_queue_that_sits_too_high_slowly_and_within_its_limit():
    s = LevelServo(0.05, time_s=20.0, limit=0.003, slew=0.0005, smooth=1)
    corr = [s.update(0.6) for _ in range(20)]
    assert corr[0] == pytest.approx(0.0005) and max(corr) == pytest.approx(0.003)
    assert s.update(0.05) < 0.003 and LevelServo(0.05).update(0.05) == 0.0


def _deliver(aligner: FarAligner, far: np.ndarray, out_speed: float, seconds: float, rng, stalls: bool = True):
    """The speaker plays ``far`` (48 kHz nominal) at ``out_speed``; the microphone path takes 24 kHz blocks of
    20 ms; the far end comes in callback blocks of 1024, late now and then (a stall: two blocks at once).
    Returns the reference taken per microphone sample."""
    refs, fpos, t, mic_n = [], 0, 0.0, 480
    out_block = 1024
    while t < seconds:
        t += mic_n / 24000.0
        due = int(t * 48000 * out_speed)
        if stalls and rng.uniform() < 0.05:
            due -= out_block                          # this block comes with the next one
        while fpos + out_block <= due:
            aligner.push(far[fpos:fpos + out_block])
            fpos += out_block
        refs.append(aligner.take(mic_n))
    return np.concatenate(refs)


@pytest.mark.parametrize("out_speed", [0.81, 1.0, 1.19])
def test_the_reference_keeps_its_pairing_with_the_microphone_at_any_clock(out_speed):
    """The reference taken at microphone sample m must be what the speaker played at m's moment, for the
    whole run: its lag against the true (resampled) signal stays put, the queue stays near the margin."""
    rng = np.random.default_rng(3)
    seconds = 40
    freqs, phases = rng.uniform(100, 3000, 40), rng.uniform(0, 2 * np.pi, 40)

    def sound(t: np.ndarray) -> np.ndarray:        # band-limited: exact at any instant
        return (0.02 * np.sin(2 * np.pi * freqs[None, :] * t[:, None] + phases[None, :]).sum(axis=1)).astype(
            np.float32)
    far = sound(np.arange(int(48000 * out_speed * (seconds + 2))) / (48000 * out_speed))
    al = FarAligner(48000, 24000)
    ref = _deliver(al, far, out_speed, seconds, rng)
    truth = sound(np.arange(ref.size) / 24000.0)     # what the speaker sounded at each microphone sample's moment
    lags = []
    for a in (15, 22, 30, 38):                       # after the start (the ratio is fitted, the level settled)
        seg = slice(a * 24000, (a + 1) * 24000)
        c = [np.dot(ref[seg], truth[seg.start - k: seg.stop - k]) for k in range(0, 2400, 4)]
        lags.append(4 * int(np.argmax(c)))
    assert max(lags) - min(lags) <= 120, lags         # within 5 ms over 23 s (the servo's deadband): no creep
    assert abs(al.level() - al.margin) < 0.06 * 24000 and al.step == pytest.approx(2 * out_speed, rel=2e-3)


def test_the_old_pairing_creeps_where_the_aligner_does_not():
    """The pairing the canceller used alone (queue the far end, one far frame per microphone frame): a speaker 0.5 %
    fast leaves its reference behind by 5 ms more every second."""
    rng = np.random.default_rng(4)
    queue, taken, lags = 0, 0, []
    far_n = 0
    for k in range(1, 2001):                         # 40 s of 20 ms blocks
        due = int(k * 480 * 1.005)
        queue += due - far_n
        far_n = due
        queue -= min(queue, 480)
        taken += 480
        if k % 500 == 0:
            lags.append(queue)
    assert lags[-1] - lags[0] > 0.1 * 24000           # the queue (the reference's lag) grew by > 100 ms
    al = FarAligner(48000, 24000)
    far = (rng.standard_normal(int(48000 * 1.005 * 42)) * 0.1).astype(np.float32)
    _deliver(al, far, 1.005, 40, rng, stalls=False)
    assert abs(al.level() - al.margin) < 0.06 * 24000 and al.jumps <= 2


class _Device(Primed):
    """A speaker that consumes its queue in 20 ms callbacks at ``speed`` of its nominal rate."""

    def __init__(self, rate: int, speed: float):
        self.rate, self.speed = rate, speed
        self.queue = PlaybackQueue(rate, 0.5)
        self.played = RingBuffer(rate * 4)
        self.count, self.clock = 0, None

    def run(self, t0: float, t1: float) -> None:
        block = self.rate // 50
        while (self.count + block) / (self.rate * self.speed) <= t1:
            self.played.write(self.pop_primed(block))
            self.count += block
            self.clock = (self.count / (self.rate * self.speed), self.count)


@pytest.mark.parametrize("speed", [0.81, 1.05])
def test_playback_follows_the_speakers_real_rate_and_drops_nothing(speed):
    """A second of speech every second for two minutes into a speaker at 81 % (or 105 %) of its rate: the queue
    stays bounded by the playback delay plus its slack without dropping speech (before: 19 % of it dropped
    at 81 %), the rate is measured, and once it is, the speaker never runs dry (what the first seconds, at the
    nominal rate, left queued drains at the servo's pace: no silence to skip here, speech all along)."""
    dev = _Device(48000, speed)
    pb = Playback(dev)
    rng = np.random.default_rng(5)
    levels, gaps = [], 0
    for k in range(120):
        speech = (rng.standard_normal(ENGINE_RATE) * 0.1).astype(np.float32)
        pb.push(speech, k)
        dev.run(k, k + 1.0)
        pb.observe()
        levels.append(pb.queued_s() / speed)          # seconds of the device's real time
        gaps = dev.queue.counts.gap_events if k == 20 else gaps
    counts = dev.queue.counts
    assert counts.dropped_speech_samples == 0 and counts.dropped_samples == 0
    assert pb.meter.speed() == pytest.approx(speed, abs=1e-3)
    assert max(levels) < 0.5 + 1.0 and max(levels[-10:]) < 0.55 and counts.gap_events == gaps   # no gap after 20 s
