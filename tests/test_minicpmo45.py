"""MiniCPM-o 4.5 backbone on the CPU at the tiny size: stock == demand bit for bit (text tokens, speech
codes, audio) with the toggles flipped mid-session; listening seconds skip the tail; the voice-activity
turn policy; the encoder's reset cycle as the planner sees it; the KV policies; the samplers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backbones.minicpmo45.audio import POSITIONS, AudioEncoder, FrontEnd, ResetWindow
from engine.backbones.minicpmo45.dims import PRESETS, Sampling, preset
from engine.backbones.minicpmo45.kv import GrowingKV, demand_units, kv_regions, make_store, switch_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.sampling import TextSampler, code_logits, top_k_top_p
from engine.core import Executor, make_plan
from engine.session.config import SessionConfig
from engine.session.session import DuplexSession

#: user speech per second: a 3 s turn, a 2 s pause (the reply), talk over it (barge-in), a 1 s turn, pause
PATTERN = [1, 1, 1, 0, 0, 1, 0, 0, 0]


def _frames(pattern, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(24000) * (0.2 if s else 0.001)).astype(np.float32) for s in pattern]


def _session(demand: bool, flips=(), pattern=PATTERN, seed=3):
    s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=seed,
                                    demand_sized=demand, graph_replay=False, cpu_threads=1))
    s.start()
    tokens, floats = [], []                     # tail tokens; LLM and TTS logits (exact, not just argmax)
    s.turn_ends = []                            # each second's Thought.turn_end
    bb = s.backbone
    think, tts_forward = bb.think, bb.tts.forward

    def spy(frames):
        floats.append(bb.protocol.logits.clone())
        t = think(frames)
        tokens.append(None if t.tokens is None else t.tokens.clone())
        s.turn_ends.append(t.turn_end)
        return t

    def tts_spy(*args):
        out = tts_forward(*args)
        floats.append(out.clone())
        return out
    bb.think, bb.tts.forward = spy, tts_spy
    thinking = _spy_on_think(bb.protocol)
    outs, recs = [], []
    for k, f in enumerate(_frames(pattern)):
        if k in flips:
            s.set_toggles(s.asked_toggles().merged(demand_sized=not s.cfg.demand_sized))
        out, rec = s.process(f)
        outs.append(out)
        recs.append(rec)
    s.close()
    for r, end in zip(recs, s.turn_ends):
        r.turn_end = end
    return np.concatenate(outs), recs, tokens, floats, thinking


def _spy_on_think(proto) -> list:
    """Per second's THINK: the turn decision it got, each step's (step, token chosen, the LLM's own draws made
    for it), and every token list fed to the LLM during THINK. A token chosen with no draw was forced."""
    thinking: list = []
    draws: list = []
    sampler, choose, step_ids, decode = proto.sampler, proto._choose, proto.step_ids, proto.decode

    def sampler_spy(logits):
        draws.append(sampler(logits))
        return draws[-1]

    def choose_spy(j, turn, logits):
        n = len(draws)
        tok = choose(j, turn, logits)
        thinking[-1]["steps"].append((j, tok, draws[n:]))
        return tok

    def step_spy(ids, logits):
        if thinking and thinking[-1]["open"]:
            thinking[-1]["fed"].append(list(ids))
        return step_ids(ids, logits)

    def decode_spy(turn):
        thinking.append({"turn": turn, "steps": [], "fed": [], "open": True})
        try:
            return decode(turn)
        finally:
            thinking[-1]["open"] = False
    proto.sampler, proto._choose, proto.step_ids, proto.decode = sampler_spy, choose_spy, step_spy, decode_spy
    return thinking


@pytest.fixture(scope="module")
def runs():
    """One stock-mode session and one demand-sized session whose toggle flips at seconds 2, 4 and 7."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield _session(False), _session(True, flips=(2, 4, 7))
    finally:
        torch.set_num_threads(n)


def test_stock_and_demand_identical_with_toggles_flipped(runs):
    (a, ra, ta, fa, _), (b, rb, tb, fb, _) = runs
    assert len(fa) == len(fb) > len(ra)
    assert all(torch.equal(x, y) for x, y in zip(fa, fb))
    assert [r.demand_sized for r in rb] == [True, True, False, False, True, True, True, False, False]
    assert [r.text for r in ra] == [r.text for r in rb]
    assert [r.decision for r in ra] == [r.decision for r in rb]
    for x, y in zip(ta, tb):
        assert (x is None and y is None) or torch.equal(x, y)
    assert np.array_equal(a, b)
    assert any(r.decision == "speak" for r in ra) and np.abs(a).max() > 0


def test_listening_seconds_skip_the_tail_and_play_silence(runs):
    out, recs, tokens, *_ = runs[1]
    assert [r.decision for r in recs] == ["listen", "listen", "listen", "speak", "speak", "listen", "speak",
                                          "listen", "listen"]
    for k, r in enumerate(recs):
        second = out[k * 24000:(k + 1) * 24000]
        if r.decision == "listen":               # second 7: the demand-sized session runs the last chunk of
            deferred = k == 7                        # the reply that ended in second 6 (token2wav, no TTS)
            assert r.tail_skipped != deferred and tokens[k] is None and not np.any(second) and r.text == ""
        else:
            assert not r.tail_skipped and r.text and r.tokens > 0
    # every reply starts with 3 silence tokens; the first is cut by a barge-in (second 5), the second
    # is a 1 s reply that ends in-turn (the tail flushes and starts its next turn afresh)
    silence = torch.full((3,), 4218)
    assert torch.equal(tokens[3][0, :3], silence) and torch.equal(tokens[6][0, :3], silence)
    assert tokens[4].shape[1] == 25 and not torch.equal(tokens[4][0, :3], silence)
    assert [r.turn_end for r in recs] == ["", "", "", "", "", "cut", "end", "", ""]


def test_voice_activity_policy_decides_from_speech_and_ends_replies():
    from engine.backbones.minicpmo45.turns import VoiceActivityTurns
    t = VoiceActivityTurns(reply_seconds=2)
    got = [t.decide(bool(s)) for s in [1, 1, 1, 0, 0, 0, 1, 0, 1]]
    assert [(d.forced, d.last) for d in got] == [
        ("listen", False), ("listen", False), ("listen", False), ("speak", False), ("speak", True),
        ("listen", False), ("listen", False), ("speak", True), ("listen", False)]


def test_voice_activity_turns_force_only_the_decision_and_reply_end_tokens(runs):
    """Forced, each second: the listen/speak decision token (step 0); in a reply's last second <|turn_eos|> at
    the step before the unit's forced end; before listening over an open reply (barge-in) one <|turn_eos|>.
    Every other token THINK chooses is the LLM's own draw (a drawn <|listen|> inside a reply becomes
    <|tts_bos|>, as in the stock loop), and THINK feeds the LLM nothing else."""
    tk, last_step = PRESETS["tiny"].tokens, PRESETS["tiny"].sampling.max_tokens_per_unit - 2
    recs, thinking = runs[1][1], runs[1][4]
    assert len(thinking) == len(recs) == len(PATTERN)
    seen = {"turn_eos forced": 0, "drawn": 0, "cut": 0}
    for k, (rec, th) in enumerate(zip(recs, thinking)):
        turn, steps = th["turn"], th["steps"]
        want = [(0, tk.listen if turn.forced == "listen" else tk.speak)]
        if turn.last and any(j == last_step for j, _, _ in steps):
            want.append((last_step, tk.turn_eos))
        assert [(j, tok) for j, tok, drawn in steps if not drawn] == want, f"second {k}: forced tokens"
        for j, tok, drawn in steps:
            if drawn:                                  # one draw, kept as drawn (or listen -> tts_bos)
                assert len(drawn) == 1 and (tok == drawn[0] or (drawn[0], tok) == (tk.listen, tk.tts_bos)), k
        cut = [[tk.turn_eos]] if rec.turn_end == "cut" else []
        chosen = [[tok] for _, tok, _ in steps if tok not in tk.chunk_terminators]
        assert th["fed"] == cut + chosen, f"second {k}: THINK fed the LLM something it did not choose"
        seen["turn_eos forced"] += len(want) - 1
        seen["drawn"] += sum(1 for _, _, drawn in steps if drawn)
        seen["cut"] += len(cut)
    assert seen["turn_eos forced"] >= 1 and seen["drawn"] >= 5 and seen["cut"] == 1, seen


def _backbone_seconds(seed: int, pattern=(1, 0, 0), keep: list = None, **kw):
    """The backbone alone (no tail): text and codes of each second (``keep``: the backbone is appended)."""
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.vad import VadResult
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", seed=seed, **kw)
    torch.manual_seed(seed)
    b.start()
    out = []
    for f, sp in zip(_frames(pattern), pattern):
        b.listen(torch.from_numpy(f), VadResult(bool(sp), 1.0 if sp else 0.0, 0.0, -70.0))
        t = b.think(25)
        out.append((t.decision, t.text, None if t.tokens is None else t.tokens.tolist()))
    if keep is not None:
        keep.append(b)
    return out


def test_tts_decode_graphs_are_prepared_for_a_replys_first_seconds_under_either_policy(one_torch_thread):
    """The voice-activity policy bounds a reply (its whole room gets per-length graphs at start); with the
    model deciding (a real checkpoint) nothing bounds it, and the first PREPARED_REPLY_SECONDS seconds at the
    declared worst case get them, so a real checkpoint's replies replay the same whole-step graphs the
    random-weights bench measures."""
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.backbones.minicpmo45 import backbone as B
    fmt = TokenFormat(1, 6561, 25.0)
    va = MiniCPMO45Backbone(fmt, size="tiny", device="cpu", seed=1, reply_seconds=3)
    model = MiniCPMO45Backbone(fmt, size="tiny", device="cpu", seed=1, turn_policy="model")
    for b in (va, model):
        b.start()
    assert va.tts_prepared_length() == va.tts_capacity == 3 * B.TTS_TOKENS_PER_SECOND
    assert model.tts_capacity == model.dims.tts.max_positions > B.PREPARED_REPLY_SECONDS * B.TTS_TOKENS_PER_SECOND
    assert model.tts_prepared_length() == B.PREPARED_REPLY_SECONDS * B.TTS_TOKENS_PER_SECOND
    assert model.tts_graphs is None and va.tts_graphs is None          # graphs run on CUDA only


def test_the_llm_store_grows_ahead_after_a_listening_second(one_torch_thread):
    """A 2-second planned LLM room (66 positions): the store grows in seconds that follow a listening one,
    before its room runs out, and the seconds are those of the stock policy's growing caches, bit for bit."""
    from engine.backbones.minicpmo45 import backbone as B
    pattern = (1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0)
    kept = []
    ahead = _backbone_seconds(3, pattern, kept, horizon_seconds=2)
    stock = _backbone_seconds(3, pattern, kept, demand_sized=False)
    a, st = kept
    assert ahead == stock and any(d == "speak" for d, _, _ in ahead)
    assert a.kv_llm.kind == "demand" and a.grown_ahead >= 1 and a.kv_llm.grown >= a.grown_ahead
    assert a.kv_llm.capacity >= a.kv_llm.length + B.GROW_AHEAD_SECONDS * a.kv_llm.worst \
        or a.kv_llm.capacity == a.kv_llm.limit
    assert all(torch.equal(x, y) for x, y in zip(a.kv_llm.export(), st.kv_llm.export()))


def test_seeded_sessions_repeat_and_seeds_differ(one_torch_thread):
    a, b, c = _backbone_seconds(3), _backbone_seconds(3), _backbone_seconds(4)
    assert a == b and a[1][0] == "speak" and len(a[1][2][0]) == 3 + 25     # a 1 s reply: silence + codes
    assert a[1][1] != c[1][1]


def test_encoder_reset_cycle_planned():
    for size, period, top in (("tiny", 2, 50), ("released", 29, 1400)):
        a = preset(size).audio
        enc_k = [r for r in AudioEncoder.regions(_Stub(a), None) if r.name == "enc_k"][0]
        assert isinstance(enc_k.retention, ResetWindow)
        plan = make_plan([enc_k], _spec())
        assert plan.settled_at == 0 and plan.period == period
        assert [s.before["enc_k"] for s in plan.timeline] == list(range(0, top + 1, POSITIONS))
        assert plan.demand["enc_k"] == top + POSITIONS <= a.max_positions


class _Stub:
    """Just enough of an AudioEncoder for ``regions`` (no weights built at released size)."""

    def __init__(self, a):
        from engine.backbones.minicpmo45.audio import Clock
        self.a = a
        self.clock = Clock("encoder", (POSITIONS,))
        self.audio_clock = Clock("seconds", (1,))
        self.conv1 = torch.nn.Conv1d(1, 1, 1)


def _spec():
    from engine.core import SessionSpec
    return SessionSpec(steps=None)


def test_encoder_stock_arena_equals_demand_arena_across_resets(one_torch_thread):
    d = preset("tiny")
    enc = AudioEncoder(d.audio, d.llm.hidden).eval()
    seeded_init(enc, 5)
    spec = enc.session_spec()
    ex = {m: Executor(enc, make_plan(enc.regions(spec), spec), "cpu", demand_sized=(m == "demand"))
          for m in ("stock", "demand")}
    front = FrontEnd(enc.fbank, enc.window, "cpu", demand_sized=True)
    rng = torch.Generator().manual_seed(0)
    for k in range(7):                                          # two resets at the tiny size
        feats = front(torch.randn(24000, generator=rng) * 0.1)
        a = ex["stock"].step({"features": feats})["emb"]
        b = ex["demand"].step({"features": feats})["emb"]
        assert a.shape == (10, d.llm.hidden) and torch.equal(a, b)
    assert ex["stock"].arena.states["enc_k"].length == ex["demand"].arena.states["enc_k"].length == 50


def test_kv_policies_give_the_same_bits_and_migrate(one_torch_thread):
    d = preset("tiny").llm
    llm = Qwen3(d).eval()
    seeded_init(llm, 1)
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 33, d.max_positions, torch.float32, "")
    cap = demand_units(regions, 3)
    assert cap == 99
    stores = [make_store(False, regions[0], d.layers, cap, "cpu"), make_store(True, regions[0], d.layers, cap, "cpu")]
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for t in (1, 11, 1, 2, 7):
            x = torch.randn(t, d.hidden, generator=g)
            a, b = llm(x, stores[0]), llm(x, stores[1])
            assert torch.equal(a, b)
            stores = [switch_store(stores[1], False, cap, "cpu"), switch_store(stores[0], True, cap, "cpu")]
    assert isinstance(stores[0], GrowingKV) and stores[0].length == stores[1].length == 22
    with pytest.raises(RuntimeError, match="horizon"):
        llm(torch.randn(cap, d.hidden), stores[1])
    # the LLM's store is growable: past the planned horizon it doubles (one copy) and the bits hold
    grow = switch_store(stores[0], True, 24, "cpu", growable=True)
    with torch.no_grad():
        x = torch.randn(9, d.hidden, generator=g)
        assert torch.equal(llm(x, stores[0]), llm(x, grow))
    assert grow.capacity == 48 and grow.grown == 1 and grow.length == 31


def test_samplers():
    x = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.isinf(top_k_top_p(x, 3, 1.0)[0, 3:]).all() and torch.isfinite(top_k_top_p(x, 3, 1.0)[0, :3]).all()
    kept = torch.isfinite(top_k_top_p(x, 6, 0.8)[0]).tolist()       # softmax mass 0.64 then 0.87: two kept
    assert kept == [True, True, False, False, False, False]
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]])               # three tied candidates, each 1/3 of the mass
    assert torch.isfinite(top_k_top_p(ties, 2, 0.5)[0]).tolist() == [False, True, True, False, False]
    s = Sampling()
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    codes = torch.tensor([0, 1, 1, 0, 0, 0], dtype=torch.long)
    out = code_logits(logits, codes, 3, s, eos=3, min_codes=5)
    t = logits / s.tts_temperature
    assert torch.allclose(out[0, :3], torch.stack([t[0, 0] / 1.05, t[0, 1] * 1.05 ** 2, t[0, 2]]))
    assert torch.isinf(out[0, 3])
    tk = PRESETS["tiny"].tokens
    ts = TextSampler(s, tk, [tk.tts_pad])
    forced = torch.full((1, 256), -50.0)
    forced[0, tk.chunk_eos] = 50.0
    assert ts(forced) == tk.chunk_eos and ts.history == []          # the raw draw ends the unit
    torch.manual_seed(0)
    free = torch.zeros(1, 256)
    free[0, tk.tts_pad] = 30.0
    picks = {ts(free) for _ in range(20)}
    assert tk.tts_pad not in picks and len(ts.history) == 20


def test_llm_layer_segments_give_the_eager_bits(one_torch_thread):
    """The per-layer segments the CUDA graphs replay (run eagerly here) == the whole eager forward."""
    from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
    d = preset("tiny").llm
    llm = Qwen3(d).eval()
    seeded_init(llm, 6)
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 33, d.max_positions, torch.float32, "")
    ref, ours = (make_store(True, regions[0], d.layers, 64, "cpu") for _ in range(2))
    segs = {t: LayerGraphs(llm, ours, torch.device("cpu"), capture=False, tokens=t) for t in (1, 2, 10)}
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for t in (11, 1, 1, 2, 1, 10, 1, 1, 2, 10):
            x = torch.randn(t, d.hidden, generator=g)
            h = llm(x, ref)
            if t == 1:
                h2, logits = segs[1].forward(x)
                assert torch.equal(h2, h) and torch.equal(logits, llm.logits(h[-1]))
            elif t in segs:                                      # a short feed: its own width's segments
                h2, none = segs[t].forward(x)
                assert torch.equal(h2, h) and none is None and torch.equal(llm.logits(h2), llm.logits(h))
            else:
                assert torch.equal(llm(x, ours), h)
    assert ours.length == ref.length == 40 and [segs[t].replays for t in (1, 2, 10)] == [5, 2, 2]
    assert torch.equal(ours.k_buf[:, :, :40], ref.k_buf[:, :, :40])


def test_a_second_session_shares_the_weights(one_torch_thread):
    """Two backbones on one set of modules (the multi-session host): each keeps its own state, same bits."""
    from engine.backbones.base import TokenFormat, make_backbone
    from engine.vad import VadResult
    fmt = TokenFormat(1, 6561, 25.0)
    a = make_backbone("minicpm-o-4.5", fmt, size="tiny", device="cpu", seed=3)
    a.start()
    b = make_backbone("minicpm-o-4.5", fmt, size="tiny", device="cpu", seed=3, shared=a.shared_weights())
    b.start()
    assert b.llm is a.llm and b.tts is a.tts and b.encoder is a.encoder and b.kv_llm is not a.kv_llm
    out = {}
    for name, bb in (("a", a), ("b", b)):
        torch.manual_seed(3)
        texts = []
        for f, sp in zip(_frames([1, 0]), [1, 0]):
            bb.listen(torch.from_numpy(f), VadResult(bool(sp), 1.0, 0.0, -70.0))
            texts.append(bb.think(25).text)
        out[name] = texts
    assert out["a"] == out["b"] and out["a"][1]
    # the short feeds every second makes, by the declared clocks (LISTEN's 2-position close, 50 encoder
    # positions a second over the pool); on the CPU nothing is captured ahead (graphs run on CUDA only)
    assert a.feed_widths() == [2, 50 // a.dims.audio.pool] == [2, 10] and a.llm_feeds == {}
    import dataclasses
    a.dims = dataclasses.replace(a.dims, audio=dataclasses.replace(a.dims.audio, pool=2))
    assert a.feed_widths() == [2]                        # 25 audio positions: past the graphed widths, eager


def test_start_pins_the_attention_kernels_before_anything_is_built(monkeypatch, one_torch_thread):
    """cuDNN attention does not repeat its bits on the H200 (device notes, run 3): the backbone turns it off
    first thing in ``start``, before any graph is captured; on the CPU nothing changes."""
    import engine.backbones.minicpmo45.backbone as B
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45.layers import pin_attention_kernels
    seen = []
    bb = B.MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu")
    monkeypatch.setattr(B, "pin_attention_kernels", lambda dev: seen.append((str(dev), hasattr(bb, "executor"))))
    bb.start()
    bb.close()
    assert seen == [("cpu", False)]
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        pin_attention_kernels("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
        pin_attention_kernels("cuda")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
