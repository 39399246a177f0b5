"""Our CPU decodes hand every shape-dependent library kernel the peer's own problems (op, shapes, strides,
dtype, alignment: :mod:`op_signatures`), so the bit tests' ``torch.equal`` holds on any x86 CPU, whichever
kernels its MKL picks (AVX-512 / AMX on Intel, AVX2 on AMD or with ``MKL_ENABLE_INSTRUCTIONS=AVX2``). A
change that alters a shape, a layout or an alignment fails here even on a CPU whose kernels happen to
round both alike. Models are built outside the recording: only the decodes are compared."""
import pytest
import torch

import stock_mimi
import test_mimi as MT
import test_nemotron_codec as NC
from engine.models.mimi import weights as MW
from engine.models.mimi.config import RELEASED as MIMI_RELEASED
from engine.models.mimi.config import TINY as MIMI_TINY
from engine.models.mimi.model import MimiDecoder
from engine.models.mimi.tail import MimiTail
from engine.models.nemotron_codec import peer as nemo
from engine.models.nemotron_codec import weights as NW
from engine.models.nemotron_codec.config import RELEASED
from engine.models.nemotron_codec.tail import make_tail
from op_signatures import assert_same_calls, record

pytestmark = [pytest.mark.oracle, pytest.mark.bits, pytest.mark.usefixtures("one_torch_thread")]
need_moshi = pytest.mark.skipif(not stock_mimi.available(), reason="moshi/einops (test oracles) not installed")
need_nemo = pytest.mark.skipif(not nemo.available(), reason="nemo-toolkit / omegaconf (test oracles) not installed")


def _nemotron_both(cfg, state, codes, pushes, **toggles):
    """(our audio, nemo's audio, our call signatures, nemo's) for one stream of ``codes`` pushed in ``pushes``."""
    codec = nemo.build(cfg, state)
    tail = make_tail(cfg=cfg, device="cpu", shared={"model": NC._model(cfg, state)}, **toggles)

    def ours():
        tail.start()
        out, i = [], 0
        for c in pushes:
            out.append(torch.from_numpy(tail.push(codes[:, i:i + c])))
            i += c
        return torch.cat(out + [torch.from_numpy(tail.flush())])
    ref, peer_calls = record(lambda: nemo.cached_decode(codec, codes))
    got, our_calls = record(ours)
    return got, ref, our_calls, peer_calls


@need_nemo
@pytest.mark.parametrize("cfg", [NC.TINY, NC.ODD, NC.NARROW, NC.WIDE_HOP], ids=["tiny", "odd", "narrow", "wide-hop"])
@pytest.mark.parametrize("demand", [True, False], ids=["demand", "stock"])
def test_nemotron_codec_issues_nemos_library_calls(cfg, demand):
    # the bit test's stream: 41 frames (seconds of 12, 13, 12, a last 4 flushed), pushes of odd sizes
    got, ref, ours, peer = _nemotron_both(cfg, NW.random_state(cfg, seed=3), NC._codes(cfg, 41, seed=4),
                                          [5, 9, 1, 20, 6], demand_sized=demand)
    assert_same_calls(ours, peer)
    assert torch.equal(got, ref)


@need_nemo
def test_nemotron_codec_released_size_issues_nemos_library_calls():
    # the released dimensions over a 12-frame second and 2 flushed frames
    got, ref, ours, peer = _nemotron_both(RELEASED, NW.random_state(RELEASED, seed=1), NC._codes(RELEASED, 14, seed=2),
                                          [14])
    assert_same_calls(ours, peer)
    assert torch.equal(got, ref)


def _mimi_both(cfg, k, frames, seed, **toggles):
    """(our audio, moshi's, our call signatures, moshi's) for ``frames`` random frames of ``k`` codebooks."""
    state = MW.random_state(cfg, seed=seed)
    codes = MT._codes(cfg, k, frames, seed=100 + seed)
    mimi = stock_mimi.build(cfg, state, num_codebooks=k)
    tail = MimiTail(MimiDecoder(cfg).load_moshi_state(state), "cpu", k, size="test", **toggles)

    def ours():
        tail.start()
        return torch.cat([torch.from_numpy(tail.push(codes[:, :5])), torch.from_numpy(tail.push(codes[:, 5:])),
                          torch.from_numpy(tail.flush())])
    ref, peer_calls = record(lambda: stock_mimi.stream_decode(mimi, codes).reshape(-1))
    got, our_calls = record(ours)
    return got, ref, our_calls, peer_calls


@need_moshi
@pytest.mark.parametrize("k,demand", [(8, True), (32, False)], ids=["8-demand", "32-stock"])
def test_mimi_issues_moshis_library_calls(k, demand):
    # the bit tests' streams: seconds of 12 and 13 frames, a ring that wraps, a short last second flushed.
    # moshi recomputes the RoPE table in every layer, ours once per frame: the same calls, other counts.
    got, ref, ours, peer = _mimi_both(MIMI_TINY, k, 30, seed=k, demand_sized=demand)
    assert_same_calls(ours, peer, counts=False)
    assert torch.equal(got, ref)


@need_moshi
def test_mimi_released_size_issues_moshis_library_calls():
    got, ref, ours, peer = _mimi_both(MIMI_RELEASED, 32, 14, seed=1)
    assert_same_calls(ours, peer, counts=False)
    assert torch.equal(got, ref)

