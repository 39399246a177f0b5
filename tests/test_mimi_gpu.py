"""GPU: Mimi whole-second graph replay == our eager modes == moshi's streaming decode, bit for bit."""
import numpy as np
import pytest
import torch

import oracles

import stock_mimi
from engine.models.mimi import weights as W
from engine.models.mimi.config import RELEASED
from engine.models.mimi.model import MimiDecoder
from engine.models.mimi.tail import MimiTail
from engine.core.toggles import Toggles

pytestmark = [pytest.mark.gpu, pytest.mark.oracle]
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
oracles.require_module(oracles.MOSHI)

DEV = "cuda"


@pytest.fixture(scope="module")
def setup():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    state = W.random_state(RELEASED, seed=11)
    model = MimiDecoder(RELEASED).to(DEV).load_moshi_state(state)
    return state, model


def _moshi(state, codes):
    return stock_mimi.stream_decode(stock_mimi.build(RELEASED, state, DEV, codes.shape[0]), codes).reshape(-1)


def _tail(model, codes, sched, chunk=5):
    """Stream ``codes`` through a tail in pushes of ``chunk`` frames: (audio, tail, the stream's executor
    stats: flush() then runs the partial last second on a one-off executor of its own)."""
    tail = MimiTail(model, DEV, codes.shape[0], **sched(0))
    tail.start()
    tail.executor.debug = True                       # assert stable state addresses at every replay
    out, i = [], 0
    while i < codes.shape[1]:
        tail.set_toggles(Toggles(**sched(tail.seconds_done)))
        out.append(tail.push(codes[:, i:i + chunk]))
        i += chunk
    stats = tail.executor.stats
    out.append(tail.flush())
    return torch.from_numpy(np.concatenate(out)).to(DEV), tail, stats


@pytest.fixture(autouse=True)
def default_order(setup):
    """Every test starts (and leaves the model) with the orders left to the self-check."""
    from engine.models.mimi.fastpaths import FLAGS
    _, model = setup
    for f in FLAGS.values():
        setattr(model, f, None)
    yield
    for f in FLAGS.values():
        setattr(model, f, None)


@pytest.mark.parametrize("k,layer_major", [(8, None), (32, None), (8, False)])
def test_whole_second_graphs_equal_eager_and_moshi(setup, k, layer_major):
    # layer_major None: the CUDA default (each layer over the whole second); False: frame by frame
    state, model = setup
    model.layer_major = layer_major
    codes = torch.randint(0, RELEASED.bins, (k, 40), generator=torch.Generator().manual_seed(k)).to(DEV)
    ref = _moshi(state, codes)
    graphs, _, stats = _tail(model, codes, lambda s: {"demand_sized": True, "graph_replay": True})
    assert stats.captures == 2 and stats.replayed_steps == 3
    demand, _, _ = _tail(model, codes, lambda s: {"demand_sized": True, "graph_replay": False})
    stock, _, _ = _tail(model, codes, lambda s: {"demand_sized": False, "graph_replay": False})
    assert ref.abs().max() > 1e-3
    assert torch.equal(graphs, ref) and torch.equal(demand, ref) and torch.equal(stock, ref)


def test_toggles_flipping_every_second_equal_moshi(setup):
    state, model = setup
    codes = torch.randint(0, RELEASED.bins, (8, 90), generator=torch.Generator().manual_seed(3)).to(DEV)
    ref = _moshi(state, codes)
    modes = [(True, True), (False, False), (True, True), (True, False), (True, True), (False, False), (True, True)]
    sched = lambda s: dict(zip(("demand_sized", "graph_replay"), modes[s % len(modes)]))
    out, _, stats = _tail(model, codes, sched, chunk=7)
    assert stats.migrations >= 2 and stats.replayed_steps >= 1
    assert torch.equal(out, ref)


def test_self_check_chooses_only_orders_equal_to_moshi(setup):
    # the start-up self-check (engine.fastpath) on this GPU: every order it enables must equal moshi on
    # other codes than its trial's, in graph replay; with the reference forced, too
    from engine import fastpath
    state, model = setup
    fastpath.clear_cache()
    codes = torch.randint(0, RELEASED.bins, (8, 40), generator=torch.Generator().manual_seed(21)).to(DEV)
    ref = _moshi(state, codes)
    out, tail, _ = _tail(model, codes, lambda s: {"demand_sized": True, "graph_replay": True})
    verdicts = {v.path: v for v in tail.fast_paths()}
    print("\n".join(v.line() for v in verdicts.values()))
    assert verdicts["layer-major order"].chosen and model.chosen["layer_major"]
    assert torch.equal(out, ref)
    from engine.models.mimi.fastpaths import FLAGS
    for path, flag in list(FLAGS.items())[1:]:
        for f in FLAGS.values():                        # this order alone, set explicitly
            setattr(model, f, f in ("layer_major", flag))
        try:
            got, _, _ = _tail(model, codes, lambda s: {"demand_sized": True, "graph_replay": True})
        finally:
            for f in FLAGS.values():
                setattr(model, f, None)
        print(f"{path} alone: equal to moshi {torch.equal(got, ref)}")
        if verdicts[path].chosen:
            assert torch.equal(got, ref), path
    fastpath.force_reference(True)
    try:
        forced, t2, _ = _tail(model, codes, lambda s: {"demand_sized": True, "graph_replay": True})
    finally:
        fastpath.force_reference(None)
    assert not any(v.chosen for v in t2.fast_paths()) and torch.equal(forced, ref)
    fastpath.clear_cache()


def test_the_ring_wraps_past_its_250_steps_equal_to_moshi(setup):
    # 155 frames = 310 transformer steps at 25 Hz (12.4 s): every layer's KV ring (250 steps) wraps, in graph
    # replay with the orders the self-check chose, and a 5-frame last second is checked at 5 frames first
    state, model = setup
    codes = torch.randint(0, RELEASED.bins, (8, 155), generator=torch.Generator().manual_seed(31)).to(DEV)
    assert codes.shape[1] * RELEASED.upsample_stride > RELEASED.context + 50
    ref = _moshi(state, codes)
    graphs, tail, stats = _tail(model, codes, lambda s: {"demand_sized": True, "graph_replay": True}, chunk=13)
    assert stats.replayed_steps == 12 and stats.captures == 2
    lines = [v.line() for v in tail.fast_paths()]
    print("\n".join(lines))
    assert any("(5-frame second)" in x for x in lines), lines
    eager, _, _ = _tail(model, codes, lambda s: {"demand_sized": True, "graph_replay": False}, chunk=13)
    assert ref.abs().max() > 1e-3 and ref.shape == graphs.shape == (155 * RELEASED.frame_size,)
    assert torch.equal(eager, ref) and torch.equal(graphs, ref)
