"""Ours == the stock Step-Audio2 token2wav package, torch.equal chunk by chunk, in every mode (CPU).

Same seeded random weights, prompt, tokens and seed on both sides. The oracle size keeps every width the
stock hard-codes (512 hidden, 8 x 64 heads) and shrinks depth; prompt and token counts are odd on purpose
(a 37-token prompt, 109 tokens: three start-up chunks, two steady chunks, a 9-token last chunk).
"""
import numpy as np
import pytest
import torch

from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.stream import schedule, synthesize

S = pytest.importorskip("stock_step_audio2")
pytestmark = pytest.mark.oracle
if not S.available():
    pytest.skip("stepaudio2 (minicpmo) is not installed", allow_module_level=True)
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
