"""Ours == the stock Step-Audio2 token2wav package, torch.equal chunk by chunk, in every mode (CPU).

Same seeded random weights, prompt, tokens and seed on both sides. The oracle size keeps every width the
stock hard-codes (512 hidden, 8 x 64 heads) and shrinks depth; prompt and token counts are odd on purpose
(a 37-token prompt, 109 tokens: three start-up chunks, two steady chunks, a 9-token last chunk).
"""
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
def stock(case):
    return stock_outputs(case)


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
    ref = stock_outputs(case)
    model = W.build(case.cfg, case.state, "cpu")
    with torch.no_grad():
        ours = synthesize(model, case.prompt, case.tokens, "demand", case.seed)
    assert [len(x) for x in ours] == [24000, (8 + 2 * 16) * 480]
    assert_chunks_equal(ours, ref)
