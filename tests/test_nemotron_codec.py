"""The Nemotron codec on the engine == nemo's own one-frame cached decode, bit for bit (CPU; nemo is a
test-only oracle loaded by file path)."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import oracles

from engine.core import make_plan
from engine.models.nemotron_codec import peer
from engine.models.nemotron_codec import weights as W
from engine.models.nemotron_codec.config import RELEASED, TINY, CodecConfig
from engine.models.nemotron_codec.tail import make_tail
from engine.core.toggles import Toggles

pytestmark = [pytest.mark.oracle, pytest.mark.bits, pytest.mark.usefixtures("one_torch_thread"),
              oracles.needs(oracles.NEMO)]

#: configs beyond the released one: other FFT sizes and overlaps, kernels, groups, block counts, codebooks
ODD = CodecConfig(latent_size=24, n_fft=32, hop_length=8, base_hidden_size=8, channel_mult=(1, 3),
                  rates=(2, 3), num_blocks=2, kernel_size=5, groups=2, codebook_size=64, num_quantizers=5,
                  wav_to_token_ratio=48, sample_rate=600)
NARROW = CodecConfig(latent_size=16, n_fft=12, hop_length=4, base_hidden_size=12, channel_mult=(2, 1, 1),
                     rates=(1, 2, 3), num_blocks=1, kernel_size=3, codebook_size=32, num_quantizers=3,
                     wav_to_token_ratio=24, sample_rate=300)
WIDE_HOP = replace(TINY, n_fft=8, hop_length=2, rates=(3, 2, 2), wav_to_token_ratio=24, sample_rate=300)


def _codes(cfg, n, seed):
    return torch.randint(0, cfg.codebook_size, (cfg.num_quantizers, n), generator=torch.Generator().manual_seed(seed))


def _stock(cfg, state, codes):
    return peer.cached_decode(peer.build(cfg, state), codes)


def _ours(cfg, state, codes, pushes, **toggles):
    tail = make_tail(cfg=cfg, device="cpu", shared={"model": _model(cfg, state)}, **toggles)
    tail.start()
    out, i = [], 0
    for c in pushes:
        out.append(torch.from_numpy(tail.push(codes[:, i:i + c])))
        i += c
    out.append(torch.from_numpy(tail.flush()))
    return torch.cat(out), tail


def _model(cfg, state):
    from engine.models.nemotron_codec.model import NemotronCodecDecoder
    m = NemotronCodecDecoder(cfg)
    W.load_into(m, W.check_state(state, cfg, "test"))
    return m


@pytest.mark.parametrize("cfg", [TINY, ODD, NARROW, WIDE_HOP], ids=["tiny", "odd", "narrow", "wide-hop"])
@pytest.mark.parametrize("demand", [True, False], ids=["demand", "stock"])
def test_equals_nemo_cached_decode(cfg, demand):
    # 41 frames: seconds of 12, 13, 12 and a last 4 flushed; pushes of odd sizes
    state = W.random_state(cfg, seed=3)
    codes = _codes(cfg, 41, seed=4)
    ref = _stock(cfg, state, codes)
    ours, tail = _ours(cfg, state, codes, [5, 9, 1, 20, 6], demand_sized=demand)
    assert ours.shape == ref.shape == (41 * cfg.wav_to_token_ratio,)
    assert tail.executor.k == 4 and tail.executor.arena.kind == ("demand" if demand else "stock")
    assert torch.equal(ours, ref)


def test_released_size_equals_nemo():
    # the one released-size test (slow on a CPU): a 12-frame and a 13-frame second, then 2 flushed
    state = W.random_state(RELEASED, seed=1)
    codes = _codes(RELEASED, 27, seed=2)
    ref = _stock(RELEASED, state, codes)
    ours, tail = _ours(RELEASED, state, codes, [27])
    assert tail.executor.k == 3
    assert torch.equal(ours, ref)


def test_toggles_flipping_every_second_keep_the_bits():
    # demand <-> stock-like arenas every second (the state migrates by exact copies), then a flush
    state = W.random_state(TINY, seed=5)
    codes = _codes(TINY, 56, seed=6)
    ref = _stock(TINY, state, codes)
    tail = make_tail(cfg=TINY, device="cpu", shared={"model": _model(TINY, state)})
    tail.start()
    out, i = [], 0
    for k, n in enumerate([12, 13, 12, 13]):
        tail.set_toggles(Toggles(demand_sized=bool(k % 2), graph_replay=True))
        out.append(torch.from_numpy(tail.push(codes[:, i:i + n])))
        i += n
    assert tail.executor.stats.migrations == 4              # every second starts in the other arena
    out.append(torch.from_numpy(tail.push(codes[:, i:])))     # 6 frames: less than a second, buffered
    out.append(torch.from_numpy(tail.flush()))
    assert torch.equal(torch.cat(out), ref)


def test_weights_keep_the_output_out_of_saturation():
    # the oracle cases exercise both sides of the window clamp without saturating the waveform
    state = W.random_state(TINY, seed=3)
    wav = _stock(TINY, state, _codes(TINY, 25, seed=4))
    assert 0.03 < float(wav.std()) < 0.4
    assert float((wav.abs() > 0.99).float().mean()) < 0.01
    assert bool(torch.isfinite(wav).all())


def test_seconds_alternate_12_and_13_frames_two_signatures():
    tail = make_tail(size="tiny", device="cpu")
    plan = tail.plan
    assert [tail.frames_in(plan.step(k)) for k in range(6)] == [12, 13, 12, 13, 12, 13]
    assert len(plan.signatures) == 2
    regions = {r.name: r for r in plan.regions}
    assert "stage0.block0.history" in regions and "istft.spec" in regions
    assert all(r.retention.kind == "fixed" for r in plan.regions)
    finite = make_plan(tail.model.regions(), tail.model.spec(steps=3, last_frames=5))
    assert [tail.frames_in(s) for s in finite.timeline] == [12, 13, 5]


@pytest.mark.parametrize("batched", [True, {"pwconv"}, {"fft", "mean"}], ids=["all", "pwconv", "fft+mean"])
def test_batched_calls_experiment_stays_close(batched):
    # one library call per second is an experiment (its bits are checked on the GPU by the benchmark, not
    # assumed): here it must decode the same audio to float rounding
    state = W.random_state(TINY, seed=3)
    codes = _codes(TINY, 25, seed=4)
    ref = _stock(TINY, state, codes)
    model = _model(TINY, state)
    model.batched = batched
    tail = make_tail(cfg=TINY, device="cpu", shared={"model": model})
    tail.start()
    ours = torch.from_numpy(np.concatenate([tail.push(codes), tail.flush()]))
    assert ours.shape == ref.shape and torch.allclose(ours, ref, atol=1e-5, rtol=0)
