"""The per-second path without host synchronizations (engine/core/hostcopy.py, sampling.race): the same values as the
synchronizing calls they replace, so every reader computes the same bits."""
from __future__ import annotations

import pytest
import torch

from engine.backbones.minicpmo45.dims import Sampling
from engine.backbones.minicpmo45.sampling import code_logits
from engine.core.hostcopy import count_codes, device_ids

pytestmark = pytest.mark.bits             # also run with the AVX2 kernels in CI (.ci/run)


def _bincount_logits(logits, codes, t, s, eos, min_codes):
    """code_logits as it was written with ``torch.bincount`` (the reference for the counts)."""
    x = logits / torch.full((1, 1), s.tts_temperature, dtype=torch.float32)
    if t > 0:
        window = codes[max(0, t - s.tts_repetition_window):t]
        count = torch.bincount(window, minlength=x.shape[-1]).to(x.dtype).view(1, -1)
        alpha = torch.pow(torch.full_like(count, s.tts_repetition_penalty), count)
        x = torch.where(x < 0, x * alpha, x / alpha)
    if t < min_codes:
        x[:, eos] = float("-inf")
    return x


def test_device_ids_on_the_cpu():
    out = device_ids([5, 0, 7, 5], "cpu")
    assert out.dtype == torch.long and out.tolist() == [5, 0, 7, 5]
    assert device_ids([], "cpu").shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_counts_equal_bincount_on_random_windows(dtype):
    g = torch.Generator().manual_seed(3)
    for w in (1, 2, 5, 16):
        for _ in range(20):
            window = torch.randint(0, 9, (w,), generator=g)          # few categories: repeats on purpose
            want = torch.bincount(window, minlength=40).to(dtype).view(1, -1)
            got = count_codes(window, 40, dtype)
            assert got.dtype == dtype and torch.equal(got, want)


def test_code_logits_equal_the_bincount_form_at_every_step():
    s = Sampling()
    g = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 6, (26,), generator=g)                  # 6 codes of 64: most windows repeat
    for t in range(26):
        logits = torch.randn(1, 64, generator=g) * 4.0               # both signs: both arms of the penalty
        for min_codes in (0, 26):
            got = code_logits(logits, codes, t, s, 63, min_codes)
            assert torch.equal(got, _bincount_logits(logits, codes, t, s, 63, min_codes)), (t, min_codes)


@pytest.mark.gpu
def test_device_ids_and_counts_on_cuda_without_a_sync():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    window = torch.randint(0, 50, (16,), device=dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")                          # any synchronizing call raises
    try:
        ids = device_ids([3, 1, 4, 1, 5], dev)
        counts = count_codes(window, 6562, torch.float32)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert ids.tolist() == [3, 1, 4, 1, 5]
    assert torch.equal(counts, torch.bincount(window, minlength=6562).float().view(1, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_race_draws_what_multinomial_draws(dtype):
    """sampling.race against torch.multinomial(probs, 1): the same category from the same generator state and
    the generator left in the same state, rows of one to many categories, peaked and flat, 1-D and 2-D."""
    from engine.backbones.minicpmo45.sampling import race
    g = torch.Generator().manual_seed(5)
    for k in range(200):
        c = (2, 7, 6562, 151_748)[k % 4]
        logits = torch.randn(1, c, generator=g) * (0.3, 3.0, 12.0)[k % 3]
        probs = torch.softmax(logits.to(dtype), dim=-1)
        probs = probs[0] if k % 2 else probs
        torch.manual_seed(k)
        want = torch.multinomial(probs, 1)
        after = torch.get_rng_state()
        torch.manual_seed(k)
        got = race(probs)
        assert got.dtype == torch.long and torch.equal(got, want), (k, c)
        assert torch.equal(torch.get_rng_state(), after)


@pytest.mark.gpu
def test_the_race_draws_what_multinomial_draws_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from engine.backbones.minicpmo45.sampling import race
    g = torch.Generator().manual_seed(6)
    for k in range(100):
        c = (7, 6562, 151_748)[k % 3]
        probs = torch.softmax((torch.randn(1, c, generator=g) * 4.0).cuda().to(torch.bfloat16 if k % 2 else torch.float32), -1)
        torch.cuda.manual_seed(k)
        want = torch.multinomial(probs, 1)
        after = torch.cuda.get_rng_state()
        torch.cuda.manual_seed(k)
        assert torch.equal(race(probs), want) and torch.equal(torch.cuda.get_rng_state(), after), (k, c)
