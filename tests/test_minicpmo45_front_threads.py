"""MiniCPM-o's CPU front end on one intra-op thread (issue 23, LISTEN's spikes): the start-up check compares its
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


def test_one_thread_front_end_gives_the_same_features_and_puts_the_threads_back(fresh_fastpath):
    fbank, window = _parts()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        verdict = A.check_one_thread(fbank, window)
        assert verdict.chosen and verdict.max_abs_diff == 0.0
        assert "bit-identical to the reference (8 tensors" in verdict.reason
        assert A.check_one_thread(fbank, window).cached                      # a later session start: no trial
        fresh_fastpath.force_reference(True)                                  # --reference-paths: the process's
        assert not A.check_one_thread(fbank, window).chosen
        ours, theirs = (A.FrontEnd(fbank, window, "cpu", demand_sized=True) for _ in range(2))
        ours.threads = 1
        seen = []
        real = StreamingLogMel._log_mel

        def spy(self, windows):
            seen.append(torch.get_num_threads())
            return real(self, windows)
        StreamingLogMel._log_mel = spy
        try:
            g = torch.Generator().manual_seed(9)
            for k in range(5):
                x = torch.randn(24000, generator=g) * 0.2
                assert torch.equal(theirs(x), ours(x)), k
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
