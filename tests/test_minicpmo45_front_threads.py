"""MiniCPM-o's CPU front end on one intra-op thread (LISTEN's spikes): the start-up check compares its
features with the process's threads bit for bit and chooses one thread only when they are equal; the thread count
comes back after every call; a planted difference under one thread turns the check down."""
from __future__ import annotations

import pytest
import torch

from engine.backbones.minicpmo45 import audio as A
from engine.backbones.minicpmo45.mel import StreamingLogMel

pytestmark = pytest.mark.bits            # also run with the AVX2 kernels (.ci/run)


def _parts():
    return A.slaney_mel(128), torch.hann_window(400, periodic=True)


def _features(fbank, window, threads, seconds=4):
    """The check's own trial, written out: fresh front ends, both input rates, on ``threads`` (None: the
    process's)."""
    g, out = torch.Generator().manual_seed(5), []
    for rate in (24000, 16000):
        front = A.FrontEnd(fbank, window, "cpu", demand_sized=True)
        front.threads = threads
        out += [front(torch.randn(rate, generator=g) * (0.3 if k % 2 else 0.02)) for k in range(seconds)]
    return out


def test_one_thread_is_chosen_exactly_where_its_features_are_the_same(fresh_fastpath):
    """Whether one thread gives the process's bits depends on the CPU's matrix product (MKL's AVX2 kernels split
    the whole-buffer mel product between threads so that columns round otherwise; its AVX-512 ones do not): the
    check must say yes exactly where the features are equal, measured here on its own."""
    fbank, window = _parts()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        same = all(torch.equal(a, b) for a, b in zip(_features(fbank, window, None), _features(fbank, window, 1)))
        verdict = A.check_one_thread(fbank, window)
        assert verdict.chosen == same
        if same:
            assert verdict.max_abs_diff == 0.0 and "bit-identical to the reference (8 tensors" in verdict.reason
        else:
            assert verdict.max_abs_diff > 0.0 and "max abs diff" in verdict.reason
        assert A.check_one_thread(fbank, window).cached                      # a later session start: no trial
        fresh_fastpath.force_reference(True)                                  # --reference-paths: the process's
        assert not A.check_one_thread(fbank, window).chosen
    finally:
        torch.set_num_threads(before)


def test_one_thread_front_end_puts_the_threads_back_every_second():
    """A front end on one thread runs its log-mel on one and hands the process its threads back after every
    second; where one thread gives the same bits (this CPU's check), its features are the process's."""
    fbank, window = _parts()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        same = all(torch.equal(a, b) for a, b in zip(_features(fbank, window, None, 2), _features(fbank, window, 1, 2)))
        ours, theirs = (A.FrontEnd(fbank, window, "cpu", demand_sized=True) for _ in range(2))
        ours.threads = 1
        seen = []
        real = StreamingLogMel._log_mel

        def spy(self, power):
            seen.append(torch.get_num_threads())
            return real(self, power)
        StreamingLogMel._log_mel = spy
        try:
            g = torch.Generator().manual_seed(9)
            for k in range(5):
                x = torch.randn(24000, generator=g) * 0.2
                a, b = theirs(x), ours(x)
                assert a.shape == b.shape and (torch.equal(a, b) or not same), k
                assert torch.get_num_threads() == 2
        finally:
            StreamingLogMel._log_mel = real
        assert seen == [2, 1] * 5                       # the process's threads, then one, each second
    finally:
        torch.set_num_threads(before)


def test_a_difference_under_one_thread_turns_the_check_down(monkeypatch, fresh_fastpath):
    fbank, window = _parts()
    real = StreamingLogMel._log_mel

    def planted(self, windows):                        # one thread rounds one feature up by an ulp
        out = real(self, windows)
        if torch.get_num_threads() == 1:
            out = out.clone()
            out[0, 0] = torch.nextafter(out[0, 0], torch.tensor(float("inf")))
        return out
    monkeypatch.setattr(StreamingLogMel, "_log_mel", planted)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        verdict = A.check_one_thread(fbank, window)
        with A.intra_op_threads(None):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert not verdict.chosen and verdict.reason.endswith("(first in out[0])")   # 24 kHz, second 0
    assert 0.0 < verdict.max_abs_diff < 1e-5
