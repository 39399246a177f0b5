"""The next second prepared in the idle time before it: the LLM's whole forwards at exact
positions (exact_graphs.py) and the TTS's per-length steps past a reply's prepared room (tts.py).

On the CPU the entries hold no graph and run the same operations eagerly: these tests check the bits of
that one-forward sequence against the layer-graph segments and the eager forward, and that the declared
clocks foresee every forward a real second makes (``next_forwards``). The CUDA graphs themselves are
checked in tests/test_minicpmo45_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.exact_graphs import ExactForwards, next_forwards, whole_forward
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs


@pytest.fixture
def one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _llm_and_stores(n: int = 3):
    d = preset("tiny").llm
    llm = Qwen3(d).eval()
    seeded_init(llm, 6)
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 33, d.max_positions, torch.float32, "")
    return d, llm, [make_store(True, regions[0], d.layers, 96, "cpu") for _ in range(n)]


def test_next_forwards_follow_the_declared_clocks():
    # a unit open (2-token close), 10 audio tokens, 19 slots (+1 for a barge-in's <|turn_eos|>)
    keys = next_forwards(100, 2, 10, 19)
    assert keys[:3] == [(2, 100), (1, 102), (10, 103)]
    assert keys[3:] == [(1, 113 + k) for k in range(20)]
    # the first second: no unit to close
    assert next_forwards(7, 0, 10, 3)[:2] == [(1, 7), (10, 8)] and next_forwards(7, 0, 10, 3)[-1] == (1, 21)


def test_whole_forward_gives_the_bits_of_the_segments_and_of_the_eager_forward(one_torch_thread):
    """One forward's operations in one sequence (what one exact graph holds) == the layer-graph segments with
    eager attention between them == the stock-like eager forward, for a decode step and both feed widths."""
    d, llm, (ref, segs_kv, whole_kv) = _llm_and_stores()
    segs = {t: LayerGraphs(llm, segs_kv, torch.device("cpu"), capture=False, tokens=t) for t in (1, 2, 10)}
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        prefix = torch.randn(9, d.hidden, generator=g)
        for kv in (ref, segs_kv, whole_kv):
            llm(prefix, kv)
        for t in (2, 1, 10, 1, 1, 2, 1, 10, 1):
            x = torch.randn(t, d.hidden, generator=g)
            start = ref.length
            h = llm(x, ref)
            h_seg, l_seg = segs[t].forward(x)
            out = whole_forward(llm, whole_kv, llm.lm_head, x.view(1, t, -1), start, torch.float32)
            whole_kv.commit(t)
            assert torch.equal(out[0], h) and torch.equal(h_seg, h)
            if t == 1:
                assert torch.equal(out[1], l_seg) and torch.equal(out[1], llm.logits(h[-1]))
            else:
                assert len(out) == 1
    n = ref.length
    assert torch.equal(whole_kv.k_buf[:, :, :n], ref.k_buf[:, :, :n])
    assert torch.equal(whole_kv.v_buf[:, :, :n], segs_kv.v_buf[:, :, :n])


def test_exact_forwards_serve_what_was_prepared_and_drop_what_was_passed(one_torch_thread):
    d, llm, (ref, ours) = _llm_and_stores(2)
    ex = ExactForwards(llm, ours, "cpu")
    assert not ex.graphed and ex.valid_for(ours)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        # nothing prepared: the caller is told to run it otherwise
        x = torch.randn(3, d.hidden, generator=g)
        assert ex.run(x) is None and ex.misses == 1
        llm(x, ref), llm(x, ours)
        keys = next_forwards(ours.length, 2, 10, 4)
        assert ex.prepare(keys) == len(keys) and ex.prepare(keys) == 0        # made once
        for t in (2, 1, 10, 1, 1):
            x = torch.randn(t, d.hidden, generator=g)
            h = llm(x, ref)
            out = ex.run(x)
            assert out is not None and torch.equal(out[0], h)
            assert (out[1] is None) == (t > 1)
        assert ex.hits == 5 and ours.length == ref.length
        # the unit ended early: its later slots stay prepared; the next second's plan drops none of them
        left = sorted(ex.entries)
        assert left == [(1, ours.length + k) for k in range(len(left))]
        ex.prepare(next_forwards(ours.length, 2, 10, 4))
        assert all(start >= ours.length for _, start in ex.entries)
        # a forward past the planned room is never prepared (the store must move first)
        assert ex.prepare([(1, ours.capacity)]) == 0
    other = make_store(True, ours.region, d.layers, 96, "cpu")
    assert not ex.valid_for(other)


def _frames(pattern, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(24000) * (0.2 if s else 0.001)).astype(np.float32) for s in pattern]


@pytest.mark.parametrize("policy", ["voice-activity", "model"])
def test_every_forward_of_a_second_was_foreseen_before_it(one_torch_thread, policy):
    """A tiny session's real seconds (replies, turn ends, a Force Listen cutting a reply): every LLM forward
    a second makes is one of the (tokens, start) keys the backbone listed after the second before."""
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.vad import VadResult
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", seed=3, turn_policy=policy,
                           reply_seconds=2)
    torch.manual_seed(3)
    b.start()
    seen = []
    real = b.protocol.llm.forward

    def watched(embeds, kv):
        seen.append((int(embeds.shape[0]), kv.length))
        return real(embeds, kv)
    b.protocol.llm.forward = watched
    pattern = [1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0]
    decisions = []
    for k, (f, sp) in enumerate(zip(_frames(pattern), pattern)):
        planned = set(b.next_forwards())
        seen.clear()
        if k == 5:
            b.force_listen()                          # a barge-in: the open reply is closed first
        b.listen(torch.from_numpy(f), VadResult(bool(sp), 1.0 if sp else 0.0, 0.0, -70.0))
        decisions.append(b.think(25).decision)
        assert seen and set(seen) <= planned, (k, sorted(set(seen) - planned))
    assert "speak" in decisions and "listen" in decisions
