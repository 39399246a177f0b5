"""The exact fused RMSNorm/RoPE on the GPU: the start-up check chooses them, and the released MiniCPM-o LLM's
layer graphs and TTS decode graphs captured with them give the eager stock chains' bits (the CPU twin, with
Triton's interpreter, is tests/test_exact_norm_rope.py)."""
from __future__ import annotations

import pytest
import torch

from engine import fastpath
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.layers import apply_rope_stock, pin_attention_kernels, rms_norm_stock
from engine.kernels import exact, norm_rope

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()


@pytest.fixture
def fused(monkeypatch):
    """The released model's check run here (it must choose the kernels), and a count of their calls."""
    if not CUDA:
        pytest.skip("needs CUDA")
    pin_attention_kernels("cuda")
    fastpath.clear_cache()
    exact.forget()
    d = preset("released")
    l, t = d.llm, d.tts
    norms = [((1, w, l.hidden), l.eps) for w in (1, 11)] + [((1, 1, l.heads, l.head_dim), l.eps),
                                                             ((1, 1, t.hidden), t.eps)]
    ropes = [(l.heads, 1, l.head_dim), (l.kv_heads, 11, l.head_dim), (t.heads, 1, t.head_dim)]
    both = [((1, 1, l.heads, l.head_dim), l.eps), ((1, 11, l.kv_heads, l.head_dim), l.eps)]
    v = exact.prepare("cuda", "released", norms, ropes, rms_norm_stock, apply_rope_stock, both)
    print(v.line())
    assert v.chosen, v.line()
    calls = {"rms_norm": 0, "rope": 0, "rms_norm_rope": 0}
    for name in calls:
        real = getattr(norm_rope, name)

        def counted(*a, _real=real, _name=name):
            calls[_name] += 1
            return _real(*a)
        monkeypatch.setattr(norm_rope, name, counted)
    yield calls
    exact.forget()
    fastpath.clear_cache()


def test_the_check_proves_the_kernels_on_this_gpu(fused):
    """Inside a capture on this device the kernels are taken; eager steps keep the stock chains."""
    x = torch.randn(1, 3, 4096, device="cuda").to(torch.bfloat16)
    assert not exact.use_fused(x)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        g.capture_begin()
        try:
            inside = exact.use_fused(x)
        finally:
            g.capture_end()
    assert inside


def test_released_llm_layer_graphs_with_the_kernels_equal_the_eager_stock_chains(fused):
    from test_minicpmo45_gpu import llm_steps
    pairs, seg = llm_steps("cuda", "released", 4, graphs=True)
    assert fused["rms_norm"] > 0 and fused["rms_norm_rope"] > 0, fused     # captured with the kernels
    for k, (a, b) in enumerate(pairs):
        assert torch.equal(a, b), f"pair {k}"


def test_released_tts_decode_graphs_with_the_kernels_equal_the_eager_stock_chains(fused):
    from test_minicpmo45_gpu import tts_turns
    pairs, dg = tts_turns("cuda", "released", graphs=True)
    assert fused["rms_norm"] > 0 and fused["rope"] > 0, fused
    for k, (a, b) in enumerate(pairs):
        assert torch.equal(a, b), f"step {k}"


def test_the_kernels_give_the_stock_bits_eagerly_over_a_wide_sweep(fused):
    """Outside the check's own trial: 262,144 rows of widths 128 and 4096 scaled 1e-4 .. 1e4, and every head
    layout of the released model, eagerly (the kernels' arithmetic does not depend on being captured)."""
    g = torch.Generator().manual_seed(7)
    for rows, d in ((262144, 128), (2048, 4096), (4096, 768)):
        x = (torch.randn(rows, d, generator=g) * torch.pow(10.0, torch.empty(rows, 1).uniform_(-4, 4, generator=g)))
        x, w = x.to(torch.bfloat16).cuda(), torch.randn(d, generator=g).to(torch.bfloat16).cuda()
        assert torch.equal(norm_rope.rms_norm(x, w, 1e-6), rms_norm_stock(x, w, 1e-6)), (rows, d)
    for h, t, hd in ((32, 1, 128), (8, 1, 128), (32, 11, 128), (8, 33, 128), (12, 1, 64), (12, 45, 64)):
        x = torch.randn(1, t, h, hd, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)
        cos, sin = (torch.randn(t, hd, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        ref, ours = apply_rope_stock(x, cos, sin), norm_rope.rope(x, cos, sin)
        assert torch.equal(ref, ours) and ref.stride() == ours.stride(), (h, t, hd)
        heads = x.transpose(1, 2).contiguous() * torch.pow(10.0, torch.empty(1, t, h, 1).uniform_(-4, 4, generator=g)
                                                            ).to(torch.bfloat16).cuda()
        w = torch.randn(hd, generator=g).to(torch.bfloat16).cuda()
        ref = apply_rope_stock(rms_norm_stock(heads, w, 1e-6).transpose(1, 2), cos, sin)
        ours = norm_rope.rms_norm_rope(heads, w, 1e-6, cos, sin)
        assert torch.equal(ref, ours) and ref.stride() == ours.stride(), ("norm+rope", h, t, hd)


def test_released_tts_past_its_room_with_the_kernels_equals_eager(fused):
    """The TTS's between-attention graphs (a reply past its prepared room), captured with the kernels, with the
    one-query attention of ``ExactAttention`` between them: every step's logits equal the eager stock step's."""
    from engine.backbones.minicpmo45.kv import kv_regions, make_store
    from engine.backbones.minicpmo45.layers import seeded_init
    from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
    from engine.backbones.minicpmo45.tts import TTS
    from engine.backbones.minicpmo45.weights import build
    d = preset("released")
    tts = build(TTS, d.tts, d.llm, device="cuda", dtype=torch.bfloat16).eval()
    seeded_init(tts, 4)
    regions = kv_regions("tts", d.tts.layers, d.tts.kv_heads, d.tts.head_dim, 45, 400, torch.bfloat16, "")
    stock, ours = make_store(False, regions[0], d.tts.layers, 0, "cuda"), make_store(True, regions[0], d.tts.layers,
                                                                                      400, "cuda")
    seg = LayerGraphs(tts, ours, torch.device("cuda"), capture=True, head=tts.head_code[0])
    assert fused["rms_norm"] > 0 and fused["rope"] > 0, fused
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        cond = (torch.randn(20, d.tts.hidden, generator=g) * 0.5).to(device="cuda", dtype=torch.bfloat16)
        assert torch.equal(tts(cond, stock), tts(cond, ours))
        for k in range(300):
            code = torch.randint(0, d.tts.codes - 1, (1,), generator=g).cuda()
            _, logits = seg.forward(tts.emb_code[0](code))
            assert torch.equal(logits, tts.step_code(code, stock)), f"step {k}"
