"""Our MiniCPM-o text sampler against the stock's own ``StreamDecoder.decode`` on seeded random cases, bit for
bit (test oracle: MiniCPM-o-Demo at 28b60cf in the stock venv, ``tests/stock_loop/decode_draws.py``).

The whole-loop tests compare the draws a conversation happens to make; this one drives every branch of the
stock's ``decode`` on purpose: the decision draw ending the unit with ``<|chunk_eos|>``, the text draw with
``<|chunk_eos|>`` boosted (StreamDecoder's constructor forbids it there: found on the H200, where
a tiny CUDA run parted from the stock at second 22 with the same logits, RNG state and history),
``<|turn_eos|>``'s logit on both sides of zero (the length penalty's two arms), histories past the 512-token
repetition window and ids past the vocabulary, bfloat16 and float32 logits. Each case: the same logits, the
same CPU RNG state before the draw, the same history; the token and the history after it must be equal."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_minicpmo45_stock_loop as S  # noqa: E402

from engine.backbones.minicpmo45.sampling import text_sampler  # noqa: E402
from engine.backbones.minicpmo45.weights import open_folder  # noqa: E402

pytestmark = [pytest.mark.oracle, pytest.mark.bits]
CASES = 400


@pytest.fixture(scope="module")
def stock_draws(tmp_path_factory):
    tmp, folder = S._stock_folder(tmp_path_factory, "stock-draws")
    out = tmp / "draws.pt"
    r = subprocess.run([str(S.STOCK_PY), str(S.ROOT / "tests" / "stock_loop" / "decode_draws.py"), str(S.ORACLE),
                        str(folder), str(out), "--cases", str(CASES)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return open_folder(folder), torch.load(out, weights_only=False)


def _replay(folder, cases: list) -> list:
    """(our token, our history after, the generator's state after) per case."""
    d = folder.dims
    got = []
    for c in cases:
        smp = text_sampler(d.sampling, d.tokens, folder.bad_token_ids)
        smp.history = list(c["history"])
        torch.set_rng_state(c["rng"])
        tok = smp(c["logits"].clone())
        got.append((tok, smp.history, torch.get_rng_state()))
    return got


def test_the_cases_reach_every_branch_of_the_stock_draw(stock_draws):
    folder, cases = stock_draws
    t = folder.dims.tokens
    assert len(cases) == CASES
    assert cases[0]["forbidden"][-1] == t.chunk_eos, "the stock's forbidden list no longer ends with chunk_eos"
    assert sum(c["token"] == t.chunk_eos for c in cases) >= 3, "the decision draw never ended a unit"
    signs = {bool(c["logits"][0, t.turn_eos] > 0) for c in cases}
    assert signs == {True, False}, "the length penalty's arms were not both taken"
    assert sum(len(c["history"]) > 512 for c in cases) >= 20
    assert any(i >= c["logits"].shape[-1] for c in cases for i in c["history"])
    assert {c["logits"].dtype for c in cases} == {torch.float32, torch.bfloat16}


def test_our_text_draw_equals_the_stock_decode_on_every_case(stock_draws, one_torch_thread):
    folder, cases = stock_draws
    for i, (c, (tok, history, rng)) in enumerate(zip(cases, _replay(folder, cases))):
        assert tok == c["token"], f"case {i} ({c['logits'].dtype}, history {len(c['history'])}): " \
                                  f"ours {tok}, stock {c['token']}"
        assert history == c["after"], f"case {i}: the repetition history after the draw differs"
        assert torch.equal(rng, c["rng_after"]), f"case {i}: the generator moved on by another amount than the stock's"


def test_the_comparison_fails_when_chunk_eos_may_be_drawn_as_text(stock_draws, monkeypatch, one_torch_thread):
    """The planted error of the ``<|chunk_eos|>`` fix: without ``<|chunk_eos|>`` in the text draw's forbidden list (the
    state before it), some case draws another token than the stock."""
    from engine.backbones.minicpmo45 import sampling
    folder, cases = stock_draws
    real = sampling.text_sampler

    def without_chunk_eos(s, tokens, bad=()):
        smp = real(s, tokens, bad)
        smp.forbidden = [i for i in smp.forbidden if i != tokens.chunk_eos]
        return smp
    monkeypatch.setattr(sys.modules[__name__], "text_sampler", without_chunk_eos)
    differ = sum(tok != c["token"] for c, (tok, _, _) in zip(cases, _replay(folder, cases)))
    assert differ >= 10, f"only {differ} of {len(cases)} cases differ"
