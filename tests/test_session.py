"""The duplex session on the CPU with the real tiny decoder tails: one second in, one out, records,
exports, toggles that never change a sample, a slow session that drops no input, config errors."""
from __future__ import annotations

import csv
import json
import math
import time

import numpy as np
import pytest

from engine.audio import frames_of, load_mono
from engine.models import registry
from engine.core.toggles import Toggles
from engine.session import (DuplexSession, LiveError, LiveResult, LiveRunner, SecondRecord, SessionConfig,
                            export_records)

TAILS = list(registry.tail_names())   # every registered decoder tail


def _cfg(tail, **kw):
    return SessionConfig(tail=tail, backbone="synthetic", size="tiny", device="cpu", seed=7, **kw)


def _run(cfg, frames, flip=False):
    s = DuplexSession(cfg)
    s.start()
    outs = []
    for k, f in enumerate(frames):
        if flip:
            s.set_toggles(Toggles(demand_sized=bool(k % 2), graph_replay=not k % 2))
        out, rec = s.process(f)
        outs.append(out)
    s.close()
    return outs, s.records, s


@pytest.mark.parametrize("tail", TAILS)
def test_session_over_speech(tail, speech_wav, tmp_path):
    frames = frames_of(load_mono(speech_wav))[:10]
    outs, records, s = _run(_cfg(tail), frames)
    assert len(outs) == len(records) == len(frames)
    assert all(o.shape == (24000,) and o.dtype == np.float32 and np.isfinite(o).all() for o in outs)
    assert [r.index for r in records] == list(range(len(frames)))
    for r in records:
        d = r.to_dict()
        assert set(d) == set(SecondRecord.columns())
        assert all(v is not None for v in d.values())
        assert r.total_ms >= r.listen_ms + r.think_ms + r.speak_ms - 1e-3 > 0
        assert min(r.listen_ms, r.think_ms, r.speak_ms) >= 0 and r.deadline_ms == 1000.0
        assert r.missed == (r.late_ms > 0) and r.queue_wait_ms == 0.0
        assert r.state_bytes > 0 and r.alloc_bytes == r.reserved_bytes == r.peak_bytes == 0   # CPU
        assert (r.tail, r.backbone) == (tail, "synthetic") and r.wall_start > 1.6e9
        assert r.demand_sized is True and r.graph_replay is False                          # no CUDA here
        assert (r.tokens > 0) == (r.decision == "speak")
    decisions = [r.decision for r in records]
    assert "speak" in decisions and "listen" in decisions
    assert any(r.user_speech for r in records) and records[0].input_rms > 0
    assert any(r.output_rms > 0 for r in records if r.decision == "speak")
    # synthetic weights decode noise: listen seconds play silence, speech is held near -20 dBFS
    for o, r in zip(outs, records):
        if r.decision == "listen":
            assert not o.any()
        else:
            assert r.output_rms <= 0.1 * 1.001
    info = s.info
    assert info["synthetic"] and "not speech" in info["note"] and info["size"] == "tiny"
    paths = export_records(records, tmp_path)
    with open(paths["csv"]) as f:
        assert len(list(csv.DictReader(f))) == len(records)
    assert len(paths["jsonl"].read_text().splitlines()) == len(records)
    trace = json.loads(paths["trace"].read_text())
    assert sum(1 for e in trace["traceEvents"] if e.get("cat") == "stage") == 3 * len(records)


@pytest.mark.parametrize("tail", TAILS)
def test_toggles_flipped_every_second_same_bits(tail, speech_wav):
    frames = frames_of(load_mono(speech_wav))[:7]
    held, rec_a, _ = _run(_cfg(tail), frames)
    flipped, rec_b, _ = _run(_cfg(tail, demand_sized=False), frames, flip=True)
    assert [r.demand_sized for r in rec_b] == [False] + [bool(k % 2) for k in range(1, 7)]
    assert any(r.decision == "speak" for r in rec_a)
    assert np.array_equal(np.concatenate(held), np.concatenate(flipped))


class SlowSession(DuplexSession):
    """A session made slow on purpose: every second takes at least ``delay`` seconds longer."""

    delay = 0.3

    def start(self):
        super().start()
        push = self.tail.push

        def slow_push(tokens):
            time.sleep(self.delay)
            return push(tokens)
        self.tail.push = slow_push


def _collect(runner, n, timeout=60.0):
    got, t0 = [], time.time()
    while len(got) < n and time.time() - t0 < timeout:
        try:
            item = runner.results.get(timeout=0.5)
        except Exception:  # queue.Empty
            continue
        assert not isinstance(item, LiveError), item.message
        got.append(item)
    return got


def test_slow_session_drops_no_input(speech_wav):
    frames = frames_of(load_mono(speech_wav))[:6]
    runner = LiveRunner(_cfg("mimi"), session_factory=SlowSession)
    runner.start()
    assert runner.ready.wait(60)
    t0 = time.perf_counter()
    for f in frames:                        # all six arrive at once: the engine is late for most
        runner.submit(f)
    assert time.perf_counter() - t0 < 0.5 and runner.backlog() >= 4      # submit never blocks
    got = _collect(runner, len(frames))
    runner.stop(timeout=10)
    assert not runner.running
    assert all(isinstance(g, LiveResult) for g in got)
    assert [g.record.index for g in got] == list(range(len(frames)))   # none dropped, in order
    waits = [g.record.queue_wait_ms for g in got]
    assert all(b > a for a, b in zip(waits, waits[1:])) and waits[-1] > 4 * 1000 * SlowSession.delay * 0.9
    assert any(g.record.missed and g.record.late_ms > 0 for g in got)
    assert all(g.record.speak_ms >= 1000 * SlowSession.delay * 0.9 for g in got)
    assert got[-1].keeps_up and got[-1].notice == ""          # 0.3 s of work a second: it catches up
    assert all(math.isclose(g.record.late_ms, max(0.0, g.record.queue_wait_ms + g.record.total_ms - 1000.0),
                            abs_tol=1e-6) for g in got)
    assert got[0].record.backlog >= 1 and got[-1].record.backlog == 0
    assert all(g.audio.shape == (24000,) for g in got)
    assert len(runner.session.records) == len(frames)


def test_live_runner_reports_failures_and_cannot_keep_up(speech_wav):
    bad = LiveRunner(SessionConfig(tail="nope", device="cpu"))
    bad.start()
    item = bad.results.get(timeout=30)
    assert isinstance(item, LiveError) and "unknown tail 'nope'" in item.message and not bad.running
    with pytest.raises(ValueError, match="one second"):
        bad.submit(np.zeros(100, np.float32))

    class HopelessSession(SlowSession):
        delay = 1.05
    frames = frames_of(load_mono(speech_wav))[:3]
    runner = LiveRunner(_cfg("mimi", graph_replay=False), session_factory=HopelessSession)
    runner.start()
    for f in frames:
        runner.submit(f)
    got = _collect(runner, 3)
    runner.stop()
    assert [g.record.missed for g in got] == [True, True, True]
    assert not got[-1].keeps_up and "cannot keep up" in got[-1].notice


def test_config_resolution_and_errors(tmp_path):
    c = SessionConfig().resolved()
    assert (c.device, c.size) == ("cpu", "tiny")                       # no CUDA here: the laptop defaults
    assert SessionConfig(size="released").resolved().size == "released"
    with pytest.raises(ValueError, match="CUDA is not available"):
        SessionConfig(device="cuda").resolved()
    with pytest.raises(ValueError, match="unknown backbone"):
        SessionConfig(backbone="gpt").resolved()
    (tmp_path / "flow.yaml").write_text("x: 1")
    (tmp_path / "hift.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=f"checkpoint folder {tmp_path} lacks flow.pt"):
        SessionConfig(checkpoint=str(tmp_path)).resolved()
    with pytest.raises(ValueError, match="not a .safetensors"):
        SessionConfig(tail="mimi", checkpoint=str(tmp_path / "hift.pt")).resolved()
    with pytest.raises(ValueError, match="weights folder"):
        SessionConfig(tail="mimi", backbone="moshi").resolved()
    with pytest.raises(ValueError, match="'mimi' tail"):
        SessionConfig(backbone="moshi", backbone_checkpoint=str(tmp_path)).resolved()
    s = DuplexSession(_cfg("mimi"))
    with pytest.raises(RuntimeError, match="not started"):
        s.process(np.zeros(24000, np.float32))
    s.start()
    with pytest.raises(ValueError, match=r"shape \(24000,\)"):
        s.process(np.zeros((2, 24000), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        s.process(np.full(24000, np.nan, np.float32))
    assert s.records == []


def test_both_tails_registered():
    names = registry.names()
    assert "step-audio2" in names and "mimi" in names


def test_a_built_session_is_frozen_out_of_the_collector_and_collected_at_close():
    """start() freezes what the build made (a full collection over it stalled a second by ~350 ms on the
    H200); close() hands it back and collects, so the closed session's reference cycles go, and freezes what
    is still alive again."""
    import gc
    import weakref
    gc.collect()
    s = DuplexSession(_cfg("mimi"))
    s.start()
    assert gc.get_freeze_count() > 0
    cycle = [s.backbone]
    cycle.append(cycle)                        # a reference cycle holding the session's backbone
    gone = weakref.ref(s.backbone)
    gc.freeze()                                # as if built with the session
    del cycle
    s.close()
    assert gone() is None                      # collected at close, though it was frozen
    assert gc.get_freeze_count() > 0
    gc.unfreeze()
