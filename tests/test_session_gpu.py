"""The duplex session on CUDA: graph replay of the synthetic decoder and of the tails gives the same
bits as eager, with toggles held or flipped every second (skipped without CUDA)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backbones.speech_decoder import SpeechDecoder, decoder_args
from engine.core import Executor, make_plan
from engine.session import DuplexSession, SessionConfig
from engine.core.toggles import Toggles

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def _decode(size, inputs, graphs, flips=None):
    torch.manual_seed(0)
    args = decoder_args(size, 6561, 1)
    m = SpeechDecoder(args, seed=3).cuda().eval()
    spec = m.session_spec()
    ex = Executor(m, make_plan(m.regions(spec), spec), "cuda", demand_sized=True, graph_replay=graphs, debug=True)
    ex.prepare_graphs(lambda sp: m.example_inputs(sp, "cuda"))
    ex.init_state({})
    torch.manual_seed(1)
    toks = []
    with torch.no_grad():
        for i, x in enumerate(inputs):
            if flips is not None:
                ex.set_toggles(Toggles(demand_sized=flips[i] != 2, graph_replay=flips[i] == 1))
            toks.append(ex.step({"x": x})["tok"])
    return torch.stack(toks), ex


@pytest.mark.parametrize("size", ["tiny", "released"])
def test_decoder_graph_replay_bit_identical(size):
    dim = decoder_args(size, 6561, 1).dim
    g = torch.Generator(device="cuda").manual_seed(5)
    n = 150 if size == "tiny" else 40                       # tiny: the 128-slot ring wraps
    inputs = [torch.randn(1, 1, dim, device="cuda", generator=g) for _ in range(n)]
    eager, _ = _decode(size, inputs, graphs=False)
    graphs, ex = _decode(size, inputs, graphs=True)
    assert ex.stats.replayed_steps == n and torch.equal(eager, graphs)
    flipped, ex2 = _decode(size, inputs, graphs=False, flips=[(i // 3) % 3 for i in range(n)])
    assert torch.equal(eager, flipped) and ex2.stats.migrations > 0


def _frames(n, seed=0):
    rng = np.random.default_rng(seed)
    talk = [1, 1, 0, 0, 1, 0, 0, 1, 1, 0][:n]
    return [(rng.standard_normal(24000) * (0.2 if t else 1e-3)).astype(np.float32) for t in talk]


@pytest.mark.parametrize("tail", ["step-audio2", "mimi"])
def test_session_modes_bit_identical_gpu(tail):
    if tail == "mimi":
        pytest.importorskip("soxr")         # the tiny Mimi decodes at 1.2 kHz: resampled to 24 kHz
    frames = _frames(8)
    outs = {}
    for name, (demand, graphs, flip) in {"stock": (False, False, False), "graphs": (True, True, False),
                                         "flip": (False, False, True)}.items():
        s = DuplexSession(SessionConfig(tail=tail, size="tiny", device="cuda", demand_sized=demand,
                                        graph_replay=graphs, seed=3))
        s.start()
        got = []
        for k, f in enumerate(frames):
            if flip:
                s.set_toggles(Toggles(demand_sized=bool(k % 2), graph_replay=bool(k % 2)))
            got.append(s.process(f)[0])
        outs[name] = np.concatenate(got)
        recs = s.records
        assert all(r.alloc_bytes > 0 and r.reserved_bytes >= r.alloc_bytes and r.peak_bytes > 0 for r in recs)
        if name == "graphs":
            assert all(r.graph_replay for r in recs)
        if name == "flip":
            assert [r.graph_replay for r in recs] == [bool(k % 2) for k in range(len(frames))]
        assert any(r.decision == "speak" for r in recs)
        s.close()
    assert np.array_equal(outs["stock"], outs["graphs"])
    assert np.array_equal(outs["stock"], outs["flip"])
