"""MiniCPM-o 4.5 on CUDA at the released sizes (bf16, seeded random weights): the encoder's per-second
graphs and the TTS's per-length decode graphs replay bit for bit what the stock-like eager path computes.
The whole session (released LLM included) is compared by ``duplexcadence-bench session`` (docs)."""
from __future__ import annotations

import pytest
import torch

from engine.backbones.minicpmo45.audio import AudioEncoder
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.tts import TTS, DecodeGraphs
from engine.backbones.minicpmo45.weights import build
from engine.core import Executor, make_plan

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()


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
    pairs = []
    with torch.no_grad():
        for _ in range(seconds):
            pcm = (torch.randn(24000, generator=g) * 0.1).to(device)
            pairs.append((stock.step({"pcm": pcm})["emb"], ours.step({"pcm": pcm})["emb"]))
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
    assert captured == 29 and stats.replayed_steps == 31
    for k, (a, b) in enumerate(pairs):
        assert torch.equal(a, b), f"second {k}"


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
    g = torch.Generator(device="cpu").manual_seed(2)
    pairs = []
    with torch.no_grad():
        for t in feeds:
            x = (torch.randn(t, d.hidden, generator=g) * 0.02).to(device=device, dtype=dt)
            h = llm(x, stock)
            if t == 1:
                h2, logits = seg.forward(x)
                pairs += [(h, h2), (llm.logits(h[-1]), logits)]
            else:
                pairs.append((h, llm(x, ours)))
    return pairs, seg


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_released_width_llm_layer_graphs_equal_eager():
    pairs, seg = llm_steps("cuda", "released", 4, graphs=True)
    assert len(seg.graphs) == 5 and seg.replays == 76
    for k, (a, b) in enumerate(pairs):
        assert torch.equal(a, b), f"pair {k}"
