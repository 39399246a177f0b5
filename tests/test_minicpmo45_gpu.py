"""MiniCPM-o 4.5 on CUDA at the released sizes (bf16, seeded random weights): the encoder's per-second
graphs, the TTS's per-length decode graphs and the LLM's layer graphs (all 36 layers, a long history)
replay bit for bit what the stock-like eager path computes; single-token attention repeats its bits past
256 positions once cuDNN attention is out; the sampler's draws between graph replays that draw are the
eager ones. The whole session is compared by ``duplexcadence-bench session`` (per-stage digests)."""
from __future__ import annotations

import pytest
import torch

from engine.backbones.minicpmo45.audio import AudioEncoder, FrontEnd
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import pin_attention_kernels, seeded_init
from engine.backbones.minicpmo45.tts import TTS, DecodeGraphs
from engine.backbones.minicpmo45.weights import build
from engine.core import Executor, make_plan

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def pinned_attention():
    """As the backbone does at start: no cuDNN attention in this process (it does not repeat its bits)."""
    if CUDA:
        pin_attention_kernels("cuda")


def encoder_seconds(device: str, size: str, seconds: int, graphs: bool):
    """Per-second audio tokens of a stock-arena eager encoder and of a demand (+ graphs) encoder."""
    d = preset(size)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    enc = build(AudioEncoder, d.audio, d.llm.hidden, device=device, dtype=dt).eval()
    enc.float_buffers(device)
    seeded_init(enc, 3)
    spec = enc.session_spec()
    stock = Executor(enc, make_plan(enc.regions(spec), spec), device, demand_sized=False)
    ours = Executor(enc, make_plan(enc.regions(spec), spec), device, demand_sized=True, graph_replay=graphs,
                    debug=True)
    captured = ours.prepare_graphs(lambda sp: enc.example_inputs(sp, device))
    g = torch.Generator(device="cpu").manual_seed(0)
    front = FrontEnd(enc.fbank, enc.window, device, demand_sized=True)
    pairs = []
    with torch.no_grad():
        for _ in range(seconds):
            feats = front((torch.randn(24000, generator=g) * 0.1).to(device))
            pairs.append((stock.step({"features": feats})["emb"], ours.step({"features": feats})["emb"]))
    return pairs, captured, ours.stats


def tts_turns(device: str, size: str, graphs: bool, turns=((7, 3), (19, 2), (1, 1))):
    """Logits of every TTS step over a few turns ((text tokens, seconds) each): eager over a growing
    cache vs the demand store (+ per-length graphs); the same codes are fed to both."""
    d = preset(size)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    tts = build(TTS, d.tts, d.llm, device=device, dtype=dt).eval()
    seeded_init(tts, 4)
    regions = kv_regions("tts", d.tts.layers, d.tts.kv_heads, d.tts.head_dim, 45, d.tts.max_positions, dt, "")
    stock = make_store(False, regions[0], d.tts.layers, 4 * 45, device)
    ours = make_store(True, regions[0], d.tts.layers, 4 * 45, device)
    dg = DecodeGraphs(tts, torch.device(device)) if graphs else None
    if dg is not None:
        dg.prepare(ours, ours.capacity)
    g = torch.Generator(device="cpu").manual_seed(1)
    pairs = []
    with torch.no_grad():
        for n_text, seconds in turns:
            for _ in range(seconds):
                cond = (torch.randn(n_text + 1, d.tts.hidden, generator=g) * 0.5).to(device=device, dtype=dt)
                pairs.append((tts(cond, stock), tts(cond, ours)))
                for _ in range(25):
                    code = torch.randint(0, d.tts.codes - 1, (1,), generator=g).to(device)
                    b = dg.step(code, ours) if dg is not None else tts.step_code(code, ours)
                    pairs.append((tts.step_code(code, stock), b))
            stock.reset()
            ours.reset()
    return pairs, dg


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_released_encoder_graphs_equal_stock_across_the_reset():
    pairs, captured, stats = encoder_seconds("cuda", "released", 31, graphs=True)
    assert captured == 30 and stats.replayed_steps == 31      # the first second's own signature + the 29
    for k, (a, b) in enumerate(pairs):
        assert torch.equal(a, b), f"second {k}"


def released_tts_pair(capacity: int):
    """The released-size TTS (bf16, seeded) with a stock store and a demand store of ``capacity`` positions."""
    d = preset("released")
    dt = torch.bfloat16
    tts = build(TTS, d.tts, d.llm, device="cuda", dtype=dt).eval()
    seeded_init(tts, 4)
    regions = kv_regions("tts", d.tts.layers, d.tts.kv_heads, d.tts.head_dim, 45, d.tts.max_positions, dt, "")
    return (d, tts, make_store(False, regions[0], d.tts.layers, 0, "cuda"),
            make_store(True, regions[0], d.tts.layers, capacity, "cuda"))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_released_tts_prefill_graphs_equal_eager_at_every_width():
    """The condition prefill replayed through layer graphs of its width (tts.PrefillGraphs: every width 1 .. 19,
    captured once over an empty store) gives the eager forward's logits and keys/values, at histories that grow
    through every width with decode steps between."""
    from engine.backbones.minicpmo45.tts import PrefillGraphs
    d, tts, stock, ours = released_tts_pair(20 * 45)
    dt = torch.bfloat16
    widest = d.sampling.max_tokens_per_unit - 1
    pf = PrefillGraphs(tts, torch.device("cuda"), widest)
    pf.capture(ours)
    assert pf.runtime.captures == sum(d.tts.layers + 1 for _ in range(widest))
    g = torch.Generator(device="cpu").manual_seed(8)
    with torch.no_grad():
        for t in list(range(1, widest + 1)) + [widest, 1, 5]:
            cond = (torch.randn(t, d.tts.hidden, generator=g) * 0.5).to(device="cuda", dtype=dt)
            want, got = tts(cond, stock), pf.run(cond, ours)
            assert got is not None and torch.equal(want, got), f"width {t} at length {stock.length - t}"
            for _ in range(3):
                code = torch.randint(0, d.tts.codes - 1, (1,), generator=g).cuda()
                assert torch.equal(tts.step_code(code, stock), tts.step_code(code, ours))
    k, v = stock.export()
    assert torch.equal(k, ours.export()[0]) and torch.equal(v, ours.export()[1]) and pf.replays == widest + 3


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_released_tts_decode_graphs_equal_eager():
    pairs, dg = tts_turns("cuda", "released", graphs=True)
    assert dg.captures == 179 and dg.replays > 100
    for k, (a, b) in enumerate(pairs):
        assert torch.equal(a, b), f"step {k}"


def llm_steps(device: str, size: str, layers: int, graphs: bool, feeds=(11, 1, 1, 2) * 8 + (1,) * 60):
    """Hidden states and logits of an LLM (``layers`` deep at ``size`` widths): eager over a growing cache
    vs the demand store with single tokens through the layer graphs."""
    import dataclasses
    from engine.backbones.minicpmo45.llm import Qwen3
    from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
    d = dataclasses.replace(preset(size).llm, layers=layers)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    llm = build(Qwen3, d, device=device, dtype=dt).eval()
    seeded_init(llm, 5)
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 33, d.max_positions, dt, "")
    stock = make_store(False, regions[0], d.layers, 0, device)
    ours = make_store(True, regions[0], d.layers, sum(feeds), device)
    seg = LayerGraphs(llm, ours, torch.device(device), capture=graphs)
    feed = LayerGraphs(llm, ours, torch.device(device), capture=graphs, tokens=2)     # LISTEN's close: 2 wide
    g = torch.Generator(device="cpu").manual_seed(2)
    pairs = []
    with torch.no_grad():
        for t in feeds:
            x = (torch.randn(t, d.hidden, generator=g) * 0.02).to(device=device, dtype=dt)
            h = llm(x, stock)
            if t == 1:
                h2, logits = seg.forward(x)
                pairs += [(h, h2), (llm.logits(h[-1]), logits)]
            elif t == 2:
                h2, _ = feed.forward(x)
                pairs += [(h, h2), (llm.logits(h), llm.logits(h2))]
            else:
                pairs.append((h, llm(x, ours)))
    return pairs, seg


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_released_width_llm_layer_graphs_equal_eager():
    pairs, seg = llm_steps("cuda", "released", 4, graphs=True)
    assert len(seg.graphs) == 5 and seg.replays == 76
    for k, (a, b) in enumerate(pairs):
        assert torch.equal(a, b), f"pair {k}"


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_full_depth_llm_layer_graphs_equal_eager_over_a_long_history():
    """All 36 released layers, the history grown past 600 positions (the bench's 20th second) by
    prefill-sized feeds, single tokens between: the layer graphs give the stock-like eager bits."""
    feeds = (64,) * 6 + ((2, 1, 10) + (1,) * 19) * 3 + (64,) * 4 + (1,) * 20
    pairs, seg = llm_steps("cuda", "released", 36, graphs=True, feeds=feeds)
    assert len(seg.graphs) == 37 and seg.kv.length == sum(feeds) > 700
    for k, (a, b) in enumerate(pairs):
        assert torch.equal(a, b), f"pair {k}"


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_grouped_attention_where_chosen_keeps_the_layer_graphs_equal_to_eager():
    """The start-up check of one-query attention over the grouped heads as they are (gqa.py) at the released
    layout, band by band of history length; where it chooses the call (over histories up to ``gqa.up_to``), all 36
    layers' graphs with it, and with the widening copies past that length, over a history past 1,300 positions give
    the stock-like eager bits (the check's own lengths are random inputs; this is the model's forward)."""
    from engine.backbones.minicpmo45 import gqa
    d = preset("released").llm
    v = gqa.prepare("cuda", d.heads, d.kv_heads, d.head_dim, torch.bfloat16)
    print(f"\n{v.line()}")
    try:
        if not v.chosen:
            pytest.skip(f"the check kept the widening copies: {v.reason}")
        # one-query steps over short histories and past 512, 1,024, 1,536 and 2,048 positions (the bands' edges)
        feeds = (1,) * 5 + ((64,) * 8 + (1,) * 10) * 4 + (2, 1, 10) + (1,) * 19
        pairs, seg = llm_steps("cuda", "released", 36, graphs=True, feeds=feeds)
        assert seg.attend.grouped_up_to == gqa.up_to("cuda") > 0 and seg.kv.length == sum(feeds) > 2100
        for k, (a, b) in enumerate(pairs):
            assert torch.equal(a, b), f"pair {k}"
    finally:
        gqa.forget()


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_sampler_draws_between_graph_replays_with_draws_equal_eager():
    """The sampler draws from the default generator between replays of a graph that itself draws (the
    token2wav tail's noise): the same tokens as with the graph's work run eagerly, and a seeded rerun
    repeats them. Near-tied logits (bf16-rounded) exercise the top-k / top-p boundaries."""
    from engine.backbones.minicpmo45.dims import SpecialTokens
    from engine.backbones.minicpmo45.sampling import code_logits, draw, text_sampler
    d = preset("released")
    dev = torch.device("cuda")
    noise_in = torch.zeros(1, 80, 300, device=dev)

    def noisy(x):                                   # stands in for the tail's step: it draws twice
        return x + torch.randn_like(x) * 0.1 + torch.rand(1, 9, device=dev).sum()

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        rng = torch.cuda.get_rng_state()
        noisy(noise_in)
        torch.cuda.set_rng_state(rng)
        with torch.cuda.graph(g, stream=s):
            out = noisy(noise_in)
    torch.cuda.current_stream().wait_stream(s)
    gen = torch.Generator(device="cpu").manual_seed(3)
    rows = [(torch.randn(1, d.llm.vocab, generator=gen) * 2).to(torch.bfloat16).float().to(dev) for _ in range(40)]
    tts_rows = [torch.randn(1, d.tts.codes, generator=gen).to(dev) for _ in range(40)]

    def run(graphed: bool):
        torch.manual_seed(0)
        sampler = text_sampler(d.sampling, SpecialTokens())
        toks, noise = [], []
        codes = torch.zeros(d.sampling.tts_steps, dtype=torch.long, device=dev)
        for i, (row, trow) in enumerate(zip(rows, tts_rows)):
            toks.append(sampler(row))
            t = i % d.sampling.tts_steps
            codes[t:t + 1] = draw(code_logits(trow, codes, t, d.sampling, d.tts.eos, d.sampling.tts_steps))
            if graphed:
                g.replay()
                noise.append(out.clone())
            else:
                noise.append(noisy(noise_in))
        return toks, codes.clone(), noise

    eager, graphed, again = run(False), run(True), run(True)
    assert eager[0] == graphed[0] == again[0] and torch.equal(eager[1], graphed[1])
    assert all(torch.equal(a, b) for a, b in zip(eager[2], graphed[2]))
    assert len(set(eager[0])) > 10                                   # real draws, not one token


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_single_token_attention_repeats_its_bits_past_256_positions():
    """The H200 run that found the cause: with cuDNN attention (torch 2.11 prefers it on Hopper) single-token
    attention over ~260-400 positions did not repeat its bits between runs. Pinned, the LLM's decode and
    prefill shapes repeat exactly, many times over."""
    import torch.nn.functional as F
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    g = torch.Generator(device="cuda").manual_seed(0)
    for tq, length in ((1, 200), (1, 257), (1, 300), (1, 511), (1, 777), (1, 1980), (10, 300), (12, 1000)):
        q = torch.randn(1, 32, tq, 128, generator=g, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn(1, 8, length, 128, generator=g, device="cuda").to(torch.bfloat16)
                .repeat_interleave(4, dim=1) for _ in range(2))
        mask = None
        if tq > 1:
            mask = torch.arange(length, device="cuda")[None, :] <= torch.arange(tq, device="cuda")[:, None] + length - tq
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        for i in range(200):
            assert torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), ref), (tq, length, i)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_tiny_session_turns_stock_equals_graphs():
    """A tiny session on CUDA with replies cut by barge-ins and replies that end in-turn: the tail goes
    back to its prompt state at each turn end (EngineTail.new_turn) under replayed graphs too, and the
    TTS's history, kept over two cuts in a row, outgrows its per-turn room (2 s replies) so its decode
    graphs are captured again over the grown store; stock-like (eager, growing caches) == graphs (demand,
    replay) for every output sample and every text."""
    import numpy as np
    from engine.session.config import SessionConfig
    from engine.session.session import DuplexSession
    pattern = [1, 1, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1, 0, 0]
    rng = np.random.default_rng(0)
    frames = [(rng.standard_normal(24000) * (0.2 if s else 0.001)).astype(np.float32) for s in pattern]
    outs = {}
    for mode, (demand, graphs) in {"stock": (False, False), "graphs": (True, True)}.items():
        s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cuda", seed=3,
                                        demand_sized=demand, graph_replay=graphs, reply_seconds=2))
        s.start()
        # the short feeds' layer graphs are captured at start: no second pays them (the LLM store never moves
        # in 14 s, so the same graphs serve every second)
        before = dict(s.backbone.llm_feeds), s.backbone.llm_graphs
        if graphs:
            assert sorted(before[0]) == s.backbone.feed_widths() == [2, 10] and before[1] is not None
        assert s.backbone.rehearsed == ("listen+speak" if demand else None)    # scratch seconds before the first
        outs[mode] = (np.concatenate([s.process(f)[0] for f in frames]), [r.text for r in s.records])
        if graphs:
            kv = s.backbone.kv_tts
            assert kv.kind == "demand" and kv.grown >= 1 and s.backbone.tts_graphs.grown == kv.grown
            assert s.backbone.kv_llm.grown == 0 and s.backbone.llm_graphs is before[1]
            assert s.backbone.tts_prefill.replays > 0       # the prefill's graphs replayed
            assert all(s.backbone.llm_feeds[t] is g for t, g in before[0].items())
        s.close()
    assert outs["stock"][1] == outs["graphs"][1] and any(outs["stock"][1])
    assert np.array_equal(outs["stock"][0], outs["graphs"][0]) and np.abs(outs["stock"][0]).max() > 0


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_tiny_llm_store_grows_ahead_with_its_graphs_captured_in_that_second():
    """A 2-second LLM room on CUDA with graphs: the store grows in seconds after a listening one, and that
    second captures the LLM's layer graphs (decode and the short feeds) over the new storage, so the graphs
    every later second replays are already valid; the seconds equal the stock policy's, bit for bit."""
    import numpy as np
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.vad import VadResult
    pattern = (1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0)
    rng = np.random.default_rng(0)
    frames = [(rng.standard_normal(24000) * (0.2 if s else 0.001)).astype(np.float32) for s in pattern]
    out, kept = {}, {}
    for mode, kw in {"ahead": dict(horizon_seconds=2), "stock": dict(demand_sized=False, graph_replay=False)}.items():
        b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cuda", seed=3, **kw)
        torch.manual_seed(3)                    # both runs draw from the same generator state (CPU and CUDA)
        b.start()
        seconds = []
        for f, sp in zip(frames, pattern):
            b.listen(torch.from_numpy(f).cuda(), VadResult(bool(sp), 1.0 if sp else 0.0, 0.0, -70.0))
            if mode == "ahead":                     # after LISTEN: every graph is over the current storage
                assert b.llm_graphs.valid_for(b.kv_llm) and all(g.valid_for(b.kv_llm) for g in b.llm_feeds.values())
            t = b.think(25)
            seconds.append((t.decision, t.text, None if t.tokens is None else t.tokens.tolist()))
        out[mode], kept[mode] = seconds, b
    a = kept["ahead"]
    assert out["ahead"] == out["stock"] and a.grown_ahead >= 1 and a.kv_llm.grown >= a.grown_ahead
    assert all(torch.equal(x, y) for x, y in zip(a.kv_llm.export(), kept["stock"].kv_llm.export()))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_tiny_model_policy_replies_replay_the_prepared_tts_graphs():
    """With the model deciding (a real checkpoint's policy) the TTS's per-length decode graphs of a reply's
    first seconds are captured at start, and a reply's steps replay them (not the between-attention graphs)."""
    import numpy as np
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.vad import VadResult
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cuda", seed=3, turn_policy="model")
    b.start()
    dg = b.tts_graphs
    assert dg.captures == b.tts_prepared_length() - 1
    layered = dg.layered                               # prepared at start where a reply can pass the room
    assert (layered is not None) == (b.kv_tts.capacity > b.tts_prepared_length())
    layered_captures = layered.runtime.captures if layered is not None else 0
    rng = np.random.default_rng(1)
    spoke = 0
    for k in range(10):                                # the first 3 s listen; the random LLM decides after
        b.listen(torch.from_numpy((rng.standard_normal(24000) * 0.1).astype(np.float32)).cuda(),
                 VadResult(True, 1.0, 0.0, -70.0))
        spoke += b.think(25).decision == "speak"
    if spoke:
        assert dg.replays >= 25 * min(spoke, 3)
    assert dg.captures == b.tts_prepared_length() - 1  # nothing captured while the seconds ran
    assert dg.layered is layered and (layered is None or layered.runtime.captures == layered_captures)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_code_head_is_folded_on_the_device_the_model_runs_on():
    """The weight-normed code head is folded where the stock folds it at every forward: on the model's device,
    in bfloat16. Folded on the CPU, some of the released 768-wide rows' norms round otherwise (on the H200
    the TTS logits one bfloat16 step off in every speaking second against the stock loop)."""
    from types import SimpleNamespace
    from engine.backbones.minicpmo45.weights import _head_weight
    gen = torch.Generator().manual_seed(9)
    g, v = torch.rand(6562, 1, generator=gen) + 0.5, torch.randn(6562, 768, generator=gen)
    base = "tts.head_code.0"
    keys = {f"{base}.parametrizations.weight.original0": g, f"{base}.parametrizations.weight.original1": v}
    sh = SimpleNamespace(folder=SimpleNamespace(weight_map=dict.fromkeys(keys, "shard")), get=keys.__getitem__)
    like = torch.empty(6562, 768, dtype=torch.bfloat16, device="cuda")
    ours = _head_weight(sh, base, like)
    stock = torch._weight_norm(v.cuda().bfloat16(), g.cuda().bfloat16(), 0)
    assert ours.device.type == "cuda" and torch.equal(ours, stock)
    on_cpu = torch._weight_norm(v.bfloat16(), g.bfloat16(), 0)
    print(f"  the fold on the CPU differs from CUDA's in {int((on_cpu != stock.cpu()).sum())} of {stock.numel()}")


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_full_depth_exact_forwards_prepared_ahead_equal_eager_over_a_long_history():
    """All 36 released layers: each second's forwards (LISTEN's 2-token close, <unit>, 10 audio tokens, then
    single tokens) prepared before the second as one graph each at their exact positions, over a
    history past 700 positions: every hidden state and logits row is the stock-like eager one."""
    from engine.backbones.minicpmo45.exact_graphs import ExactForwards, next_forwards
    from engine.backbones.minicpmo45.llm import Qwen3
    d = preset("released").llm
    dt = torch.bfloat16
    llm = build(Qwen3, d, device="cuda", dtype=dt).eval()
    seeded_init(llm, 5)
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 33, d.max_positions, dt, "")
    stock = make_store(False, regions[0], d.layers, 0, "cuda")
    ours = make_store(True, regions[0], d.layers, 1200, "cuda")
    ex = ExactForwards(llm, ours, "cuda")
    g = torch.Generator(device="cpu").manual_seed(7)
    rand = lambda t: (torch.randn(t, d.hidden, generator=g) * 0.02).to(device="cuda", dtype=dt)   # noqa: E731
    with torch.no_grad():
        for _ in range(10):                                   # a long prelude, eager on both sides
            x = rand(64)
            llm(x, stock), llm(x, ours)
        made = 0
        for second, decoded in enumerate((19, 3, 0, 12)):
            made += ex.prepare(next_forwards(ours.length, 2, 10, 19))
            for t in (2, 1, 10) + (1,) * decoded:
                x = rand(t)
                h = llm(x, stock)
                out = ex.run(x)
                assert out is not None, (second, t)
                assert torch.equal(out[0], h), (second, t)
                if t == 1:
                    assert torch.equal(out[1], llm.logits(h[-1])), (second, t)
    assert ex.hits == 4 * 3 + 34 and ex.misses == 0 and made >= ex.hits and ex.runtime.captures == made
    n = ours.length
    ks, vs = stock.export()
    assert torch.equal(ours.k_buf[:, :, :n], ks) and torch.equal(ours.v_buf[:, :, :n], vs)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_released_tts_steps_captured_ahead_past_the_room_equal_eager():
    """A reply longer than its prepared room (60 positions here): before each second the next 45 lengths are
    captured, each launched once there (its upload; it writes only past the history), so every step
    replays its own graph, never the between-attention ones; the logits are the eager ones, the lengths passed
    are dropped, and a ``stop`` that turns True (the next frame) ends the captures where it does."""
    d, tts, stock, ours = released_tts_pair(400)
    dt = torch.bfloat16
    dg = DecodeGraphs(tts, torch.device("cuda"), recurring=60)
    dg.prepare(ours, 60)
    g = torch.Generator(device="cpu").manual_seed(1)
    made = 0
    with torch.no_grad():
        for i, n_text in enumerate((7, 0, 18, 3, 11)):
            if i == 2:                                    # the next frame came after 5 captures: the rest waits
                asked = []
                part = dg.ahead(ours, 45, stop=lambda: asked.append(1) or len(asked) > 5)
                assert part == 5 and len(asked) == 6
                made += part
            made += dg.ahead(ours, 45)
            cond = (torch.randn(n_text + 1, d.tts.hidden, generator=g) * 0.5).to(device="cuda", dtype=dt)
            assert torch.equal(tts(cond, stock), tts(cond, ours))
            for _ in range(25):
                code = torch.randint(0, d.tts.codes - 1, (1,), generator=g).to("cuda")
                assert torch.equal(tts.step_code(code, stock), dg.step(code, ours)), ours.length
        dg.ahead(ours, 45)
    assert dg.layered.replays == 0 and made > 0 and dg.replays == 125 and ours.length == 169
    assert all(n <= 60 or n > ours.length for n in dg.graphs) and max(dg.graphs) == 169 + 45


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_tiny_session_with_seconds_prepared_ahead_equals_stock(monkeypatch):
    """A tiny session on CUDA whose idle time prepares the next second (``DuplexSession.ahead``), in graphs
    mode and with the toggles flipped every second: every output sample and text equals the stock-like run;
    in graphs mode the prepared LLM forwards served every forward, and replies outgrow a 1-second prepared TTS
    room (4-second replies), so the TTS steps past it are captured ahead inside the backbone's open step."""
    import numpy as np
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.core.toggles import Toggles
    monkeypatch.setattr(MiniCPMO45Backbone, "tts_prepared_length", lambda self: 45)
    from engine.session.config import SessionConfig
    from engine.session.session import DuplexSession
    pattern = [1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 0]
    rng = np.random.default_rng(0)
    frames = [(rng.standard_normal(24000) * (0.2 if s else 0.001)).astype(np.float32) for s in pattern]
    outs = {}
    for mode in ("stock", "graphs", "flip"):
        on = mode != "stock"
        s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cuda", seed=3,
                                        demand_sized=on and mode != "flip", graph_replay=on and mode != "flip",
                                        reply_seconds=4))
        s.start()
        out = []
        for k, f in enumerate(frames):
            if mode == "flip":
                s.set_toggles(Toggles(bool(k % 2), bool(k % 2)))
            out.append(s.process(f)[0])
            s.ahead("all")                     # the first second had nothing prepared: ahead starts after it
        outs[mode] = (np.concatenate(out), [r.text for r in s.records])
        if mode == "graphs":
            ex = s.backbone.llm_exact
            assert ex is not None and ex.misses == 0 and ex.hits >= 4 * (len(frames) - 1)
            assert sum(r.ahead_captures for r in s.records) > 0 and all(r.ahead_ms > 0 for r in s.records)
            assert s.backbone.tts_graphs.captures > 44       # the room's 44, then lengths past it, ahead
        s.close()
    assert any(outs["stock"][1])
    for mode in ("graphs", "flip"):
        assert outs[mode][1] == outs["stock"][1], mode
        assert np.array_equal(outs[mode][0], outs["stock"][0]), mode


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_released_tts_steps_past_the_room_replay_the_prepared_layer_graphs_equal_eager():
    """A reply past its prepared room (60 positions here) runs the between-attention graphs captured
    at start (no capture in any second), their one-query attention on its own lane (the second product written
    straight into the next graph's input); the logits equal the eager model's at every length."""
    d, tts, stock, ours = released_tts_pair(400)
    dt = torch.bfloat16
    dg = DecodeGraphs(tts, torch.device("cuda"), recurring=60)
    dg.prepare(ours, 60)
    layered, captures = dg.layered, dg.captures
    assert layered is not None and layered.attend.lane and layered._lane is not None    # the lean loop runs
    g = torch.Generator(device="cpu").manual_seed(6)
    past = 0
    with torch.no_grad():
        for n_text in (5, 19, 0, 12, 8, 3):
            cond = (torch.randn(n_text + 1, d.tts.hidden, generator=g) * 0.5).to(device="cuda", dtype=dt)
            assert torch.equal(tts(cond, stock), tts(cond, ours))
            for _ in range(25):
                code = torch.randint(0, d.tts.codes - 1, (1,), generator=g).to("cuda")
                past += ours.length + 1 > 60
                assert torch.equal(tts.step_code(code, stock), dg.step(code, ours)), ours.length
    assert past > 60 and layered.replays == past and dg.replays == 150
    assert dg.layered is layered and dg.captures == captures and layered.runtime.captures == 21
