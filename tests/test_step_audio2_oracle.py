"""Ours == the stock Step-Audio2 token2wav package, torch.equal chunk by chunk, in every mode (CPU).

Same seeded random weights, prompt, tokens and seed on both sides. The oracle size keeps every width the
stock hard-codes (512 hidden, 8 x 64 heads) and shrinks depth; prompt and token counts are odd on purpose
(a 37-token prompt, 109 tokens: three start-up chunks, two steady chunks, a 9-token last chunk).
"""
import importlib

import numpy as np
import pytest
import torch

import oracles
from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.stream import schedule, synthesize

oracles.require_module(oracles.STEPAUDIO2)
import stock_step_audio2 as S  # noqa: E402
pytestmark = pytest.mark.oracle
assert_chunks_equal, make_case, stock_outputs = S.assert_chunks_equal, S.make_case, S.stock_outputs


@pytest.fixture(scope="module")
def case():
    return make_case("oracle", prompt_tokens=37, n_tokens=109)


@pytest.fixture(scope="module")
def stock_run(case):
    f0 = []
    outs = stock_outputs(case, f0_log=f0)
    return outs, torch.cat([x.flatten() for x in f0])


@pytest.fixture(scope="module")
def stock(stock_run):
    return stock_run[0]


def assert_voiced_and_unclamped(case, outs, f0):
    """The case reaches the vocoder's voiced path (f0 in the speech range, a few unvoiced frames for the
    other branch) and its audio stays inside the clamp, so an error in the sine source shows in the bits."""
    hift = case.cfg.hift
    voiced = (f0 > hift.nsf_voiced_threshold).float().mean().item()
    speech = ((f0 >= 80) & (f0 <= 400)).float().mean().item()
    assert voiced >= 0.9 and voiced < 1.0, f"fraction of voiced frames {voiced:.3f}"
    assert speech >= 0.5, f"fraction of frames with f0 in 80-400 Hz {speech:.3f}"
    audio = np.concatenate(outs)
    clamped = float(np.mean(np.abs(audio) >= hift.audio_limit))
    assert clamped < 0.01, f"fraction of samples at the clamp {clamped:.4f}"
    assert float(np.std(audio)) > 0.01


def test_oracle_weights_reach_the_voiced_path_inside_the_clamp(case, stock_run):
    assert_voiced_and_unclamped(case, *stock_run)


def test_schedule_has_start_up_steady_and_short_last_chunks(case):
    sched = schedule(len(case.tokens))
    assert [n for _, n, _ in sched] == [28, 28, 28, 28, 9]
    assert [last for *_, last in sched] == [False] * 4 + [True]


@pytest.mark.parametrize("mode", ["stock", "demand", "graphs"])
def test_every_mode_is_bit_identical_to_the_stock_package(case, stock, mode):
    model = W.build(case.cfg, case.state, "cpu")
    with torch.no_grad():
        ours = synthesize(model, case.prompt, case.tokens, mode, case.seed)
    assert_chunks_equal(ours, stock)


def test_released_dims_two_chunks_bit_identical():
    case = make_case("released", prompt_tokens=23, n_tokens=41, seed=11)
    f0 = []
    ref = stock_outputs(case, f0_log=f0)
    assert_voiced_and_unclamped(case, ref, torch.cat([x.flatten() for x in f0]))
    model = W.build(case.cfg, case.state, "cpu")
    with torch.no_grad():
        ours = synthesize(model, case.prompt, case.tokens, "demand", case.seed)
    assert [len(x) for x in ours] == [24000, (8 + 2 * 16) * 480]
    assert_chunks_equal(ours, ref)


# -- the three blocks written from the mathematics, each against the stock's own module --------------------

def _stock(module: str, name: str):
    S._load()
    return getattr(importlib.import_module("stepaudio2." + module), name)


@pytest.mark.parametrize("d_model, max_len", [(512, 5000), (80, 37), (64, 1)])
def test_rel_position_table_equals_the_stock_encoding(d_model, max_len):
    from engine.models.step_audio2.encoder import rel_position_table
    stock = _stock("cosyvoice2.transformer.embedding", "EspnetRelPositionalEncoding")(d_model, 0.0, max_len)
    assert torch.equal(rel_position_table(d_model, max_len), stock.pe)


def test_rel_pos_attention_equals_the_stock_on_every_cache_and_chunk_length(one_torch_thread):
    from engine.models.step_audio2.encoder import RelPosSelfAttention, rel_position_table
    h, c = 8, 512
    stock = _stock("cosyvoice2.transformer.attention", "RelPositionMultiHeadedAttention")(h, c, 0.0, True).eval()
    g = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(v.shape, generator=g) * (0.05 if v.dim() > 1 else 0.1) for k, v in stock.state_dict().items()}
    stock.load_state_dict(sd)
    ours = RelPosSelfAttention(h, c)
    ours.load_state_dict(sd)
    pe = rel_position_table(c)
    mid = pe.shape[1] // 2
    for cached, t in [(0, 1), (0, 25), (3, 1), (28, 2), (100, 56)]:   # (0, 1): the stock skips its rel_shift
        x = torch.randn(1, t, c, generator=g)
        cache = torch.randn(1, h, cached, 2 * c // h, generator=g) if cached else None
        pos = pe[:, mid - (cached + t) + 1: mid + cached + t]
        slot = torch.empty(1, h, t, 2 * c // h)
        with torch.no_grad():
            ref, new_cache = stock(x, x, x, pos_emb=pos, cache=torch.zeros(0, 0, 0, 0) if cache is None else cache)
            out = ours(x, pos, cache, slot)
        assert torch.equal(out, ref), (cached, t)
        assert torch.equal(slot, new_cache[:, :, cached:]), (cached, t)


@pytest.mark.parametrize("scale", [480, 15, 4])
def test_sine_phase_equals_the_stock_sine_generator(scale):
    from engine.models.step_audio2.hift_parts import SineSource
    stock = _stock("flashcosyvoice.modules.hifigan_components.layers", "SineGen2")(24000, scale, harmonic_num=8)
    ours = SineSource(24000, scale, 8, 0.1, 0.003, 10.0)
    g = torch.Generator().manual_seed(scale)
    for frames in (1, 7, 58):
        f0 = (80 + 320 * torch.rand(1, frames, 1, generator=g)).repeat_interleave(scale, 1)   # voiced, 80-400 Hz
        f0 = f0 * (1 + 0.1 * torch.rand(1, frames * scale, 1, generator=g))                 # and moving within frames
        f = f0 * ours.harmonics
        torch.manual_seed(1)
        ref = stock._f02sine(f.clone())
        after_stock = torch.rand(4)
        torch.manual_seed(1)
        out = ours._sines(f.clone())
        assert torch.equal(out, ref), (scale, frames)
        assert torch.equal(torch.rand(4), after_stock)                       # the generator left where the stock leaves it
