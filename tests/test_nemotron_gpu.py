"""GPU: the Nemotron codec's whole-second graph replay == our eager modes == nemo's one-frame cached
decode (deterministic cuDNN, TF32 off), bit for bit, at the released size and a small one — with the
batched library calls the start-up self-check takes on this GPU, and on the all-per-frame reference path."""
import pytest
import torch

import oracles

from engine import fastpath
from engine.models.nemotron_codec import peer
from engine.models.nemotron_codec import weights as W
from engine.models.nemotron_codec.config import RELEASED, TINY
from engine.models.nemotron_codec.fastpaths import ORDER, choose, path_name
from engine.models.nemotron_codec.model import NemotronCodecDecoder
from engine.models.nemotron_codec.tail import make_tail
from engine.core.toggles import Toggles

pytestmark = [pytest.mark.gpu, pytest.mark.oracle]
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
oracles.require_module(oracles.NEMO)

DEV = "cuda"


def _setup(cfg, seed):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    state = W.random_state(cfg, seed)
    model = NemotronCodecDecoder(cfg)
    W.load_into(model, W.check_state(state, cfg, "test"))
    codes = torch.randint(0, cfg.codebook_size, (cfg.num_quantizers, 52), generator=torch.Generator().manual_seed(seed))
    ref = peer.cached_decode(peer.build(cfg, state, DEV), codes.to(DEV)).cpu()
    return model.to(DEV), codes, ref


def _decode(model, codes, sched):
    """Push 12/13-frame seconds with the toggles ``sched(second)``, then 2 frames flushed."""
    tail = make_tail(device=DEV, shared={"model": model}, **sched(0))
    tail.start()
    tail.executor.debug = True                       # assert stable state addresses at every replay
    out, i = [], 0
    while i + tail.frames_needed() <= codes.shape[1] - 2:
        tail.set_toggles(Toggles(**sched(tail.seconds_done)))
        n = tail.frames_needed()
        out.append(torch.from_numpy(tail.push(codes[:, i:i + n])))
        i += n
    stats = tail.executor.stats
    out.append(torch.from_numpy(tail.push(codes[:, i:])))
    out.append(torch.from_numpy(tail.flush()))
    return torch.cat(out), stats


@pytest.mark.parametrize("cfg", [TINY, RELEASED], ids=["tiny", "released"])
def test_graph_replay_equals_nemo_and_eager(cfg):
    model, codes, ref = _setup(cfg, seed=7)
    graphs, st = _decode(model, codes, lambda k: {"demand_sized": True, "graph_replay": True})
    assert st.captures == 2 and st.replayed_steps == 4 and st.eager_steps == 0
    demand, _ = _decode(model, codes, lambda k: {"demand_sized": True, "graph_replay": False})
    stock, _ = _decode(model, codes, lambda k: {"demand_sized": False, "graph_replay": False})
    assert graphs.shape == ref.shape
    assert torch.equal(demand, ref) and torch.equal(stock, ref) and torch.equal(graphs, ref)


def test_toggles_flipping_mid_session_on_cuda():
    model, codes, ref = _setup(RELEASED, seed=8)
    modes = [(True, True), (False, False), (True, False), (True, True)]
    out, _ = _decode(model, codes, lambda k: dict(zip(("demand_sized", "graph_replay"), modes[k % 4])))
    assert torch.equal(out, ref)


@pytest.mark.parametrize("cfg", [TINY, RELEASED], ids=["tiny", "released"])
def test_self_checked_batched_calls_and_the_reference_path_keep_nemos_bits(cfg, capsys):
    fastpath.clear_cache()
    fastpath.force_reference(False)
    try:
        model, codes, ref = _setup(cfg, seed=9)
        verdicts = choose(model, DEV)
        with capsys.disabled():
            print(f"\n[{cfg.base_hidden_size}] " + "\n  ".join(v.line() for v in verdicts))
        assert [v.path for v in verdicts[:len(ORDER)]] == [path_name([k]) for k in ORDER]
        assert all(v.reason.startswith(("bit-identical", "max abs diff", "the reference")) for v in verdicts)
        chosen, _ = _decode(model, codes, lambda k: {"demand_sized": True, "graph_replay": True})
        model.batched = False                                    # every library call per frame
        reference, _ = _decode(model, codes, lambda k: {"demand_sized": True, "graph_replay": True})
        assert torch.equal(chosen, ref) and torch.equal(reference, ref)
    finally:
        fastpath.force_reference(None)

