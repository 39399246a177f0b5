"""The codec's batched library calls go through the start-up self-check (engine.fastpath): each kind is
tried against the per-frame reference, taken only where every output bit and every state region match,
and a stream then decodes exactly as the reference does. CPU, tiny size (the GPU verdicts are in
tests/test_nemotron_gpu.py)."""
import numpy as np
import pytest
import torch

from engine import fastpath
from engine.models.nemotron_codec import blocks, fastpaths
from engine.models.nemotron_codec import weights as W
from engine.models.nemotron_codec.config import TINY
from engine.models.nemotron_codec.fastpaths import ORDER, choose
from engine.models.nemotron_codec.model import NemotronCodecDecoder
from engine.models.nemotron_codec.tail import make_tail

pytestmark = [pytest.mark.bits, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(autouse=True)
def fresh_verdicts():
    fastpath.clear_cache()
    fastpath.force_reference(False)
    yield
    fastpath.force_reference(None)
    fastpath.clear_cache()


def _model(seed: int = 3) -> NemotronCodecDecoder:
    m = NemotronCodecDecoder(TINY)
    W.load_into(m, W.check_state(W.random_state(TINY, seed), TINY, "test"))
    return m


def _stream(model, codes) -> np.ndarray:
    tail = make_tail(cfg=TINY, device="cpu", shared={"model": model})
    tail.start()
    out = np.concatenate([tail.push(codes), tail.flush()])
    return out, tail


def _codes(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY.codebook_size, (TINY.num_quantizers, n), generator=torch.Generator().manual_seed(seed))


def test_the_cpu_checks_nothing_and_batches_nothing():
    m = _model()
    verdicts = choose(m, "cpu")
    assert [v.path for v in verdicts] == [fastpaths.path_name([k]) for k in ORDER]
    assert all(not v.chosen and v.reason.startswith("not applicable") for v in verdicts)
    assert m.chosen == frozenset() and m.batched is None and m.batched_kinds() == frozenset()


def test_what_the_check_takes_decodes_the_reference_bits():
    m = _model()
    verdicts = choose(m, "cpu", check_cpu=True)
    assert m.batched is None                                    # the trials ran on a copy of the model
    assert {v.path for v in verdicts[:len(ORDER)]} == {fastpaths.path_name([k]) for k in ORDER}
    for v in verdicts:
        assert v.chosen == v.reason.startswith("bit-identical") and "\n" not in v.line()
    kinds = m.chosen
    assert kinds <= frozenset(ORDER)
    codes = _codes(52, seed=9)                                  # 4 seconds + 2 frames: fresh codes, not the trial's
    ours, _ = _stream(m, codes)
    ref_model = _model()
    ref_model.batched = False
    ref, _ = _stream(ref_model, codes)
    assert np.array_equal(ours, ref)
    # a second stream finds every verdict in the cache and checks nothing again
    again = choose(m, "cpu", check_cpu=True)
    assert [v.chosen for v in again] == [v.chosen for v in verdicts] and all(v.cached for v in again)


def test_a_batched_call_one_ulp_off_is_refused(monkeypatch):
    real = blocks.per_frame

    def off_by_one_ulp(fn, x, batched=False, **layout):
        y = real(fn, x, batched, **layout)
        return torch.nextafter(y, torch.full_like(y, float("inf"))) if batched else y
    monkeypatch.setattr(blocks, "per_frame", off_by_one_ulp)
    m = _model()
    verdicts = choose(m, "cpu", check_cpu=True)
    assert len(verdicts) == len(ORDER) and not any(v.chosen for v in verdicts)
    assert all("max abs diff" in v.reason for v in verdicts)
    assert m.chosen == frozenset()


def test_kinds_that_pass_alone_but_not_together_are_taken_greedily():
    seen = []

    def check(kinds, why=None):
        seen.append(sorted(kinds))
        ok = not {"dwconv", "fft"} <= kinds                     # these two break the bits together
        return fastpath.Verdict(fastpaths.path_name(kinds), ok, "bit-identical" if ok else "max abs diff 1e-07")
    out = []
    taken = fastpaths._combine(frozenset({"pwconv", "dwconv", "fft"}), check, out)
    assert taken == frozenset({"pwconv", "dwconv"})
    assert seen == [["dwconv", "fft", "pwconv"], ["dwconv", "pwconv"], ["dwconv", "fft", "pwconv"]]
    assert [v.chosen for v in out] == [False, True, False]


def test_explicit_batched_is_kept_and_the_tail_reports_its_verdicts():
    m = _model()
    m.batched = {"pwconv"}
    v = choose(m, "cpu", check_cpu=True)
    assert len(v) == 1 and v[0].chosen and "set explicitly" in v[0].reason and m.batched_kinds() == {"pwconv"}
    _, tail = _stream(_model(), _codes(13, seed=2))
    assert [x.path for x in tail.fast_paths()] == [fastpaths.path_name([k]) for k in ORDER]
