"""The engine host on CUDA: concurrent hosted sessions (threads, own streams, graph replay) give their
solo output bit for bit; the batched LISTEN check runs on the device and batched groups keep the bits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.audio import frames_of
from engine.bench.session import speech_like
from engine.host import EngineHost
from engine.session import DuplexSession, LiveError, SessionConfig

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

SECONDS = 6


def _solo(cfg, frames):
    s = DuplexSession(cfg)
    s.start()
    out = np.concatenate([s.process(f)[0] for f in frames])
    s.close()
    return out


def _run(host, cfgs, inputs, flips=None):
    runners = [host.open(c, force=True) for c in cfgs]
    for r in runners:
        r.start()
        assert r.ready.wait(300)
    for k in range(SECONDS):
        for i, r in enumerate(runners):
            if flips and flips[i] and k in flips[i]:
                r.set_toggles(r.asked_toggles().merged(**flips[i][k]))
            r.submit(inputs[i][k])
    outs = []
    for r in runners:
        got = []
        for _ in range(SECONDS):
            res = r.results.get(timeout=300)
            assert not isinstance(res, LiveError), res.message
            got.append(res.audio)
        outs.append(np.concatenate(got))
    return outs, runners


@pytest.mark.parametrize("tail", ["step-audio2", "mimi"])
def test_concurrent_hosted_sessions_equal_solo(tail):
    if tail == "mimi":
        pytest.importorskip("soxr")           # the tiny Mimi decodes at 1.2 kHz; the session resamples
    cfg = SessionConfig(tail=tail, size="tiny", device="cuda", seed=5)
    cfgs = [cfg, cfg, cfg.replace(demand_sized=False, graph_replay=False), cfg]
    flips = [None, None, None, {2: {"graph_replay": False}, 4: {"graph_replay": True}}]
    inputs = [frames_of(speech_like(SECONDS, seed=300 + i))[:SECONDS] for i in range(len(cfgs))]
    host = EngineHost(device="cuda", launch="threads")
    outs, runners = _run(host, cfgs, inputs, flips)
    assert sum(r.hosted.exclusive_seconds for r in runners[:2]) == 0     # graph seconds ran concurrently
    host.close()
    for i, c in enumerate(cfgs):
        assert np.array_equal(outs[i], _solo(c, inputs[i])), f"{tail} session {i} differs from its solo run"


@pytest.mark.parametrize("n", [2, 3])
def test_batched_listen_groups_keep_bits(n):
    """Whatever this device's check says for a group of ``n``: chosen, the group's LISTEN replays batched;
    refused, every member steps its own graphs. Either way each session equals its solo run, bit for bit."""
    cfg = SessionConfig(tail="step-audio2", size="tiny", device="cuda", seed=6)
    host = EngineHost(device="cuda", launch="threads", batched=True, batch_slots=3)
    ok, why = host.batched_check(cfg, slots=n)
    print(f"batched check at {n} slots:", ok, why)
    assert f"over {n} slots" in why or "max |diff|" in why or "differs" in why, why
    inputs = [frames_of(speech_like(SECONDS, seed=400 + i))[:SECONDS] for i in range(n)]
    outs, runners = _run(host, [cfg] * n, inputs)
    rounds = host.batcher.report()
    host.close()
    assert len(rounds) == 1 and rounds[0]["members"] == n, rounds
    if ok:
        assert rounds[0]["batched_rounds"] > 0, rounds
    else:                                          # refused at this size: no batched step ran
        assert rounds[0]["batched_rounds"] == 0, rounds
    assert sum(r.hosted.exclusive_seconds for r in runners) == 0             # the members' seconds interleaved
    for i in range(n):
        assert np.array_equal(outs[i], _solo(cfg, inputs[i])), f"batched session {i} differs from its solo run"


@pytest.mark.parametrize("hand_over", [False, True])
def test_whole_minicpmo_sessions_start_and_stop_at_random_seconds(tmp_path, hand_over):
    """Five whole MiniCPM-o 4.5 sessions (encoder, LLM, TTS, token2wav; tiny dims) start and stop at random
    seconds of each other, so their builds and captures overlap the others' seconds; one flips its
    toggles, two have 2 s replies whose TTS store outgrows its room (a capture inside a concurrent second);
    one whose folder is empty fails to start, alone, with one line. Builds hold the gate *capturing*, so
    other sessions' seconds run while a build captures (shown by their wall spans). Every other session
    equals its solo run, bit for bit. ``hand_over``: builds hand the capture lock to a session waiting to
    capture between their own captures (session 22; off by default until this passes on the GPU)."""
    import time
    rng = np.random.default_rng(2026)
    base = SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cuda")
    cfgs = [base.replace(seed=10 + i, reply_seconds=2 if i in (1, 3) else 4) for i in range(5)]
    starts = [0] + sorted(int(x) for x in rng.integers(1, 6, size=4))
    lengths = [int(x) for x in rng.integers(5, 9, size=5)]
    inputs = [frames_of(speech_like(10, seed=700 + i))[:10] for i in range(5)]
    flips = {2: {1: {"graph_replay": False}, 3: {"graph_replay": True}}}
    from engine.core.gate import GATE
    handovers = GATE.handovers
    host = EngineHost(device="cuda", launch="threads", hand_over=hand_over)
    runners, fed, outs = {}, {i: 0 for i in range(5)}, {i: [] for i in range(5)}
    for tick in range(max(s + n for s, n in zip(starts, lengths)) + 1):
        if tick == 2:
            with pytest.raises(ValueError, match="lacks config.json") as bad:
                host.open(base.replace(seed=1, backbone_checkpoint=str(tmp_path)), force=True)
            assert "\n" not in str(bad.value)
        for i in range(5):
            if starts[i] == tick:
                runners[i] = host.open(cfgs[i], force=True)
                runners[i].start()                   # builds (and captures) while the others run
            if i in runners and fed[i] < lengths[i] and tick >= starts[i]:
                if i in flips and fed[i] in flips[i]:
                    runners[i].set_toggles(runners[i].asked_toggles().merged(**flips[i][fed[i]]))
                runners[i].submit(inputs[i][fed[i]])
                fed[i] += 1
                if fed[i] == lengths[i]:
                    runners[i].stop(timeout=600, drain=True)
        time.sleep(0.05)
    for i, r in runners.items():
        assert r.done.wait(600)
        while not r.results.empty():
            res = r.results.get()
            assert not isinstance(res, LiveError), f"session {i}: {res.message}"
            outs[i].append(res.audio)
        assert len(outs[i]) == lengths[i], (i, len(outs[i]))
    builds = [r.hosted.build_span for r in runners.values()]
    overlaps = sum(1 for r in runners.values() for a, b in r.hosted.spans for b0, b1 in builds
                   if a < b1 and b0 < b)
    print("seconds that ran during another session's build:", overlaps, "; hand-overs:", GATE.handovers - handovers)
    assert overlaps > 0, "no second ran beside a build: captures did not overlap work"
    host.close()
    for i in range(5):
        solo = _solo(cfgs[i], inputs[i][:lengths[i]])
        assert np.array_equal(np.concatenate(outs[i]), solo), f"MiniCPM-o session {i} differs from its solo run"


def test_minicpmo_sessions_in_llm_rounds_equal_solo():
    """Four whole MiniCPM-o sessions (tiny) in the host's LLM rounds (engine/host/llm_rounds.py), fed together so
    their THINKs meet: each session's audio is its solo run's, bit for bit, rounds ran (the group step, captured,
    over members present and absent) and none failed; one session flips its state policy at second 2 and back at
    4 (it leaves the rounds and joins again)."""
    cfg = SessionConfig(tail="step-audio2", backbone="minicpm-o-4.5", size="tiny", device="cuda", seed=7)
    cfgs = [cfg] * 4
    flips = [None, None, None, {2: {"demand_sized": False}, 4: {"demand_sized": True}}]
    inputs = [frames_of(speech_like(SECONDS, seed=500 + i))[:SECONDS] for i in range(len(cfgs))]
    host = EngineHost(device="cuda", launch="threads", llm_rounds=True)
    try:
        outs, runners = _run(host, cfgs, inputs, flips)
        report = host.llm_rounds.report()
        print("llm rounds:", report, [r.hosted.rounds_note for r in runners])
        for i, (c, frames) in enumerate(zip(cfgs, inputs)):
            s = DuplexSession(c)
            s.start()
            solo = []
            for k, f in enumerate(frames):
                if flips[i] and k in flips[i]:
                    s.set_toggles(s.asked_toggles().merged(**flips[i][k]))
                solo.append(s.process(f)[0])
            s.close()
            assert np.array_equal(outs[i], np.concatenate(solo)), f"session {i} differs from its solo run"
        assert report and sum(g["rounds"] for g in report) > 0, report
        assert not any(g["errors"] for g in report), report
    finally:
        host.close()
