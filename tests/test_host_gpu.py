"""The engine host on CUDA: sessions on one device's scheduler (each its own stream, graph replay, batched LLM
steps where the backbone declares them) give their solo output bit for bit, joining and leaving at random
seconds; a session that fails to start fails alone."""
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
    host = EngineHost(device="cuda")
    outs, runners = _run(host, cfgs, inputs, flips)
    host.close()
    for i, c in enumerate(cfgs):
        assert np.array_equal(outs[i], _solo(c, inputs[i])), f"{tail} session {i} differs from its solo run"


@pytest.mark.parametrize("batched", [False, True])
def test_whole_minicpmo_sessions_start_and_stop_at_random_seconds(tmp_path, batched):
    """Five whole MiniCPM-o 4.5 sessions (encoder, LLM, TTS, token2wav; tiny dims) start and stop at random
    seconds of each other, so their builds and captures overlap the others' seconds; one flips its
    toggles, two have 2 s replies whose TTS store outgrows its room (a capture inside a second); one whose
    folder is empty fails to start, alone, with one line. Builds run in the scheduler's slices between the
    other sessions' seconds (shown by their wall spans); with ``batched`` the one-token LLM forwards of the
    sessions present run as group steps (some did). Every other session equals its solo run, bit for bit."""
    import time
    rng = np.random.default_rng(2026)
    base = SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cuda")
    cfgs = [base.replace(seed=10 + i, reply_seconds=2 if i in (1, 3) else 4) for i in range(5)]
    starts = [0] + sorted(int(x) for x in rng.integers(1, 6, size=4))
    lengths = [int(x) for x in rng.integers(5, 9, size=5)]
    inputs = [frames_of(speech_like(10, seed=700 + i))[:10] for i in range(5)]
    flips = {2: {1: {"graph_replay": False}, 3: {"graph_replay": True}}}
    host = EngineHost(device="cuda", batched=batched)
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
    report = host.scheduler_report()
    print("seconds that ran during another session's build:", overlaps, "; scheduler:", report)
    assert overlaps > 0, "no second ran beside a build: captures did not overlap work"
    grouped = report["batches"].get("minicpm-o-4.5 llm step", {}).get("members_max", 0)
    assert (grouped > 1) == batched, report
    host.close()
    for i in range(5):
        solo = _solo(cfgs[i], inputs[i][:lengths[i]])
        assert np.array_equal(np.concatenate(outs[i]), solo), f"MiniCPM-o session {i} differs from its solo run"


def test_minicpmo_sessions_batched_equal_solo():
    """Four whole MiniCPM-o sessions (tiny) fed together, so their one-token LLM forwards meet in group steps:
    each session's audio is its solo run's, bit for bit, group steps of several members ran, and none fell back;
    one session flips its state policy at second 2 and back at 4 (it leaves its seat and takes one again)."""
    cfg = SessionConfig(tail="step-audio2", backbone="minicpm-o-4.5", size="tiny", device="cuda", seed=7)
    cfgs = [cfg] * 4
    flips = [None, None, None, {2: {"demand_sized": False}, 4: {"demand_sized": True}}]
    inputs = [frames_of(speech_like(SECONDS, seed=500 + i))[:SECONDS] for i in range(len(cfgs))]
    host = EngineHost(device="cuda")
    try:
        outs, runners = _run(host, cfgs, inputs, flips)
        report = host.scheduler_report()
        steps = {k: r.report() for (k, _), r in host.scheduler._runners.items()}
        print("scheduler:", report, steps)
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
        llm = steps["minicpm-o-4.5 llm step"]
        assert llm["group_steps"] > 0 and report["batches"]["minicpm-o-4.5 llm step"]["members_max"] > 1, report
    finally:
        host.close()
