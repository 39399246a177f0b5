"""The engine host on the CPU: sessions in one host give their solo output bit for bit; admission.

Tiny models, seeded random weights. Each hosted session gets its own speech-like input; some flip
their toggles during the run. The reference for each is the same config and input run alone in a
plain DuplexSession.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from engine.audio import frames_of
from engine.bench.session import speech_like
from engine.host import EngineHost, HostFull, LoadMeter
from engine.host.admission import memory_refusal, union_ms
from engine.session import DuplexSession, LiveError, SessionConfig

SECONDS = 5


def _cfg(tail: str, **kw) -> SessionConfig:
    return SessionConfig(tail=tail, size="tiny", device="cpu", seed=kw.pop("seed", 3), cpu_threads=1, **kw)


def _inputs(n: int, seconds: int = SECONDS):
    # different speech for each session: bursts, pauses, and the answers they trigger
    return [frames_of(speech_like(seconds, seed=100 + i))[:seconds] for i in range(n)]


def _solo(cfg: SessionConfig, frames, flips=None):
    s = DuplexSession(cfg)
    s.start()
    out = []
    for k, f in enumerate(frames):
        if flips and k in flips:
            s.set_toggles(s.asked_toggles().merged(**flips[k]))
        out.append(s.process(f)[0])
    s.close()
    return np.concatenate(out)


def _hosted(host: EngineHost, cfgs, inputs, flips):
    """Run every session through its runner, frames submitted interleaved; returns each one's audio."""
    runners = [host.open(c, force=True) for c in cfgs]
    for r in runners:
        r.start()
    for r in runners:
        assert r.ready.wait(120)
    for k in range(len(inputs[0])):
        for i, r in enumerate(runners):
            if flips[i] and k in flips[i]:
                r.set_toggles(r.asked_toggles().merged(**flips[i][k]))
            r.submit(inputs[i][k])
    outs = []
    for r, frames in zip(runners, inputs):
        got = []
        for _ in frames:
            res = r.results.get(timeout=120)
            assert not isinstance(res, LiveError), res.message
            got.append(res.audio)
        outs.append(np.concatenate(got))
    for r in runners:
        r.stop(drain=True)
    return outs, runners


FLIP_DEMAND = {1: {"demand_sized": False}, 3: {"demand_sized": True}, 4: {"demand_sized": False}}


def test_hosted_sessions_equal_solo_step_audio2(one_torch_thread):
    host = EngineHost(device="cpu")
    cfgs = [_cfg("step-audio2"), _cfg("step-audio2", demand_sized=False), _cfg("step-audio2")]
    flips = [None, {2: {"demand_sized": True}}, FLIP_DEMAND]
    inputs = _inputs(len(cfgs))
    outs, runners = _hosted(host, cfgs, inputs, flips)
    for i, (c, frames) in enumerate(zip(cfgs, inputs)):
        solo = _solo(c, frames, flips[i])
        assert np.array_equal(outs[i], solo), f"session {i} differs from its solo run"
    assert any(np.abs(o).max() > 0 for o in outs)                # somebody spoke
    assert not np.array_equal(outs[0], outs[2])                  # different inputs, different outputs
    # one copy of the weights: every later session was built around the first one's modules
    assert all(r.hosted.memory.weights_reused for r in runners[1:])
    assert not runners[0].hosted.memory.weights_reused and runners[0].hosted.memory.shared_loaded > 0
    assert host.active() == 0 and all(r.done.is_set() and not r.running for r in runners)
    host.close()


def test_hosted_sessions_equal_solo_mimi(one_torch_thread):
    host = EngineHost(device="cpu")
    cfgs = [_cfg("mimi"), _cfg("mimi", demand_sized=False), _cfg("mimi")]
    flips = [FLIP_DEMAND, None, None]
    inputs = _inputs(len(cfgs), 5)
    outs, _ = _hosted(host, cfgs, inputs, flips)
    for i, (c, frames) in enumerate(zip(cfgs, inputs)):
        assert np.array_equal(outs[i], _solo(c, frames, flips[i])), f"mimi session {i} differs from solo"
    host.close()


def test_weights_shared_by_key(one_torch_thread):
    host = EngineHost(device="cpu")
    a = host.admit(_cfg("mimi"))
    b = host.admit(_cfg("mimi"), force=True)
    c = host.admit(_cfg("mimi", seed=4), force=True)              # other seed: other weights
    assert a.session.tail.model is b.session.tail.model
    assert a.session.backbone.model is b.session.backbone.model
    assert c.session.tail.model is not a.session.tail.model
    assert a.session.tail.executor is not b.session.tail.executor   # state and graphs stay per session
    mem = host.memory()
    assert len(mem["shared_weights"]) == 4 and mem["sessions"][1]["weights_reused"]
    host.close()
    assert host.active() == 0


def test_admission_refuses_without_headroom(one_torch_thread):
    host = EngineHost(device="cpu", reserve_ms=995.0, min_seconds=2)
    cfg = _cfg("mimi")
    first = host.admit(cfg)                                         # an empty host admits
    with pytest.raises(HostFull, match="still measuring"):
        host.open(cfg)
    for f in _inputs(1, 3)[0]:
        first.process(f)
    with pytest.raises(HostFull, match="no headroom") as e:
        host.open(cfg)
    assert "\n" not in str(e.value)
    assert host.headroom_ms() < 0
    roomy = EngineHost(device="cpu", reserve_ms=0.0, min_seconds=2)
    s = roomy.admit(cfg)
    for f in _inputs(1, 3)[0]:
        s.process(f)
    assert roomy.refusal(cfg) is None and roomy.headroom_ms() > 0
    capped = EngineHost(device="cpu", max_sessions=1)
    capped.admit(cfg)
    with pytest.raises(HostFull, match="1 of 1"):
        capped.open(cfg)
    for h in (host, roomy, capped):
        h.close()


def test_runner_stopped_before_start_frees_its_slot():
    host = EngineHost(device="cpu", max_sessions=1)
    r = host.open(_cfg("mimi"))
    t = time.perf_counter()
    r.stop()
    assert time.perf_counter() - t < 1.0 and host.active() == 0 and r.done.is_set() and not r.running
    host.open(_cfg("mimi")).stop()
    host.close()


def test_admission_arithmetic():
    m = LoadMeter(window_s=10.0, reserve_ms=100.0, min_seconds=1)
    m.sessions_changed()
    t = time.perf_counter()
    for k in range(4):                      # two sessions, 300 ms each per second, overlapping by 100 ms
        m.record(t + k, t + k + 0.3, 300.0, 0)
        m.record(t + k + 0.2, t + k + 0.5, 320.0, 1)
    h = m.headroom(2, now=t + 4)
    assert h.busy_ms == pytest.approx(500.0, rel=1e-6)     # 500 ms busy per second of audio
    assert h.worst_ms == pytest.approx(320.0) and h.cost_ms == pytest.approx(250.0)
    assert h.admits_one_more() and m.refusal(2, 8) is None and h.free_ms == pytest.approx(400.0)
    m.record(t + 4, t + 4.85, 850.0, 0)                     # one slow second: 850 + ~294 > 900
    assert "no headroom" in m.refusal(2, 8)
    assert union_ms([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3000.0)
    idle = LoadMeter(min_seconds=2)                         # a session that sends nothing: no seconds at all
    idle.sessions_changed()
    assert "still measuring" in idle.refusal(1, 2)
    idle._since -= 10.0                                     # ... a few wall seconds later the host decides
    assert idle.refusal(1, 2) is None
    assert memory_refusal(10 << 30, 1 << 30) is None
    assert "not enough GPU memory" in memory_refusal(1 << 30, 1 << 30)


def test_host_bad_arguments():
    with pytest.raises(ValueError, match="max_sessions"):
        EngineHost(device="cpu", max_sessions=0)
    if not torch.cuda.is_available():
        host = EngineHost(device="cpu")
        with pytest.raises(ValueError, match="CUDA is not available"):
            host.open(SessionConfig(device="cuda"))


@pytest.mark.parametrize("tail, backbone", [("step-audio2", "minicpm-o-4.5"), ("nemotron-codec", "synthetic")])
def test_hosted_sessions_equal_solo_other_pairs(one_torch_thread, tail, backbone):
    # every backbone/tail pair the session supports runs hosted: MiniCPM-o 4.5 (shared LLM, TTS and tail weights)
    # and the Nemotron codec tail, one session flipping demand sizing mid-run
    host = EngineHost(device="cpu")
    cfgs = [_cfg(tail, backbone=backbone), _cfg(tail, backbone=backbone)]
    flips = [None, FLIP_DEMAND]
    inputs = _inputs(len(cfgs), 6)
    outs, runners = _hosted(host, cfgs, inputs, flips)
    for i, (c, frames) in enumerate(zip(cfgs, inputs)):
        assert np.array_equal(outs[i], _solo(c, frames, flips[i])), f"{backbone}+{tail} session {i} differs from solo"
    assert runners[1].hosted.memory.weights_reused
    assert all(np.abs(o).max() > 0 for o in outs)                # each spoke: every stage ran
    host.close()


def test_a_removed_sessions_failure_stays_in_the_load_errors():
    """A capacity ramp removes a session that failed; the bench's errors (its JSON) still name it."""
    import queue
    import types
    from engine.host.drive import Driven, PacedLoad
    load = PacedLoad(host=None)
    runners = [types.SimpleNamespace(results=queue.Queue(), stop=lambda timeout=0.0: None) for _ in range(2)]
    load.sessions += [Driven(i, r, []) for i, r in enumerate(runners)]
    load.sessions[0].error = "RuntimeError: the build failed"
    load.remove_last()
    load.remove_last()
    try:
        assert load.errors() == ["session 0: RuntimeError: the build failed"] and not load.sessions
    finally:
        load.close()


def test_a_window_counts_every_second_that_came_due_finished_or_not():
    """An overloaded ramp step printed "45 missed of 7" on the H200: it counted only finished seconds. The window's
    seconds are those that came due; one that has not finished is a miss and counts among them."""
    import types
    from engine.host.drive import Driven, PacedLoad

    def rec(k, ms, missed=False):
        return types.SimpleNamespace(index=k, total_ms=ms, queue_wait_ms=0.0, missed=missed, decision="listen")
    load = PacedLoad(host=None)
    try:
        late = Driven(0, None, [], t0=100.0, next_k=10)        # 10 frames came, 2 seconds finished (one missed)
        late.records = [rec(0, 900.0), rec(1, 1100.0, missed=True)]
        fine = Driven(1, None, [], t0=100.5, next_k=3)
        fine.records = [rec(k, 100.0) for k in range(3)]
        load.sessions += [late, fine]
        w = load.window(100.0, 110.0)
        assert (w.seconds, w.misses) == (13, 9)
        assert [(p["seconds"], p["finished"], p["misses"]) for p in w.per_session] == [(10, 2, 9), (3, 3, 0)]
    finally:
        load.sessions.clear()
        load.close()


def test_a_session_is_admitted_for_its_horizon(one_torch_thread):
    """The memory check counts what the admitted sessions' state will still grow by before the host's horizon (a
    MiniCPM-o LLM store at its declared worst case), and says so in one line; the horizon is a positive number."""
    with pytest.raises(ValueError, match="horizon_s"):
        EngineHost(device="cpu", horizon_s=float("nan"))
    why = memory_refusal(1 << 30, 2 << 30, horizon_s=600.0)
    assert why.startswith("not enough GPU memory for another session for 10 minutes") and "\n" not in why
    host = EngineHost(device="cpu", horizon_s=600.0)
    s = host.admit(_cfg("step-audio2", backbone="minicpm-o-4.5"))
    try:
        bb = s.session.backbone
        assert bb.horizon_bytes(600) > bb.horizon_bytes(60) >= bb.state_bytes()
        assert s.memory.horizon > s.memory.state and s.growth_left() == s.memory.horizon - s.memory.state
        assert host._session_bytes() >= s.memory.horizon - s.memory.state
    finally:
        host.close()
