"""The replayed forward's eager attention (``llm_graphs.ExactAttention``): the stock path's operands and kernels in
fewer host operations, so the same bits as the stock form (:func:`layer_attend` below) and as the eager model, for the LLM (grouped-query,
SDPA) and the TTS (one query, written-out attention), in float32 and bfloat16, one token and several."""
import pytest
import torch

from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import attend, causal_mask, seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.llm_graphs import ExactAttention, LayerGraphs
from engine.backbones.minicpmo45.tts import TTS
from engine.backbones.minicpmo45.weights import build


def layer_attend(model, kv, i: int, q: torch.Tensor, n: int, mask) -> torch.Tensor:
    """The stock form: exact-length slices of the storage, keys and values repeated per query head (as the
    stock's ``repeat_kv``), then the stock attention."""
    a = model.model.layers[i].self_attn
    k_all, v_all = kv.k_buf[i:i + 1, :, :n], kv.v_buf[i:i + 1, :, :n]                  # [1, Hkv, n, hd]
    if a.hkv != a.h:
        k_all = k_all.repeat_interleave(a.h // a.hkv, dim=1)
        v_all = v_all.repeat_interleave(a.h // a.hkv, dim=1)
    return attend(q, k_all, v_all, mask, a.explicit)


def _filled(model, d, dtype, capacity: int, seed: int):
    regions = kv_regions("x", d.layers, d.kv_heads, d.head_dim, 33, capacity, dtype, "")
    kv = make_store(True, regions[0], d.layers, capacity, "cpu")
    g = torch.Generator().manual_seed(seed)
    kv.k_buf.copy_(torch.randn(kv.k_buf.shape, generator=g))
    kv.v_buf.copy_(torch.randn(kv.v_buf.shape, generator=g))
    return kv, g


@pytest.mark.bits
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["llm", "tts"])
def test_exact_attention_gives_layer_attends_bits(which, dtype, one_torch_thread):
    d = preset("tiny")
    dims = d.llm if which == "llm" else d.tts
    model = (build(Qwen3, dims, device="cpu", dtype=dtype) if which == "llm"
             else build(TTS, d.tts, d.llm, device="cpu", dtype=dtype)).eval()
    kv, g = _filled(model, dims, dtype, 96, seed=5)
    fast = ExactAttention(model, kv)
    a = model.model.layers[0].self_attn
    assert fast.group == a.h // a.hkv and fast.explicit == a.explicit
    with torch.no_grad():
        for n in (1, 2, 17, 63, 64, 65, 95, 96):
            for t in (1, 2, 10):
                if t > n:
                    continue
                q = torch.randn(1, a.h, t, a.hd, generator=g).to(dtype)
                mask = causal_mask(t, n, "cpu")
                for i in range(dims.layers):
                    ref, ours = layer_attend(model, kv, i, q, n, mask), fast(i, q, n, mask)
                    assert torch.equal(ref, ours) and ref.stride() == ours.stride(), (which, n, t, i)
                    into = torch.full_like(ref, float("nan"))
                    fast.into(i, q, n, mask, into)              # the TTS's one query: its own lane
                    assert torch.equal(ref, into), (which, n, t, i)
    assert fast.lane == (which == "tts")


@pytest.mark.bits
def test_tts_layer_segments_give_the_eager_steps_bits(one_torch_thread):
    """The TTS past its prepared room: the between-attention segments (run eagerly here) over a growing history
    equal the eager model's steps, logits and stored keys and values."""
    d = preset("tiny")
    tts = build(TTS, d.tts, d.llm, device="cpu", dtype=torch.float32).eval()
    seeded_init(tts, 8)
    regions = kv_regions("tts", d.tts.layers, d.tts.kv_heads, d.tts.head_dim, 45, 128, torch.float32, "")
    ref, ours = (make_store(True, regions[0], d.tts.layers, 128, "cpu") for _ in range(2))
    seg = LayerGraphs(tts, ours, torch.device("cpu"), capture=False, head=tts.head_code[0])
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        cond = torch.randn(6, d.tts.hidden, generator=g)
        assert torch.equal(tts(cond, ref), tts(cond, ours))
        for _ in range(40):
            code = torch.randint(0, d.tts.codes - 1, (1,), generator=g)
            _, logits = seg.forward(tts.emb_code[0](code))
            assert torch.equal(logits, tts.step_code(code, ref))
    assert ours.length == ref.length == 46 and seg.replays == 40
    assert torch.equal(ours.k_buf[:, :, :46], ref.k_buf[:, :, :46])
