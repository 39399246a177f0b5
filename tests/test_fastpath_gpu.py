"""GPU: what the start-up self-check chooses keeps the bits where production runs it, inside captured graphs.

The trials run as production runs a path (on CUDA eagerly and captured + replayed; the fused kernel captured
only). Here, on other inputs than the trials' where the model allows, every path the check chose, run inside a
captured graph and replayed, equals the reference path run eagerly (the order whose bits the oracle tests tie
to the stock packages), torch.equal: Mimi's orders (whole seconds and a short last one), the codec's batched
calls and Step-Audio2's DiT / HiFT / encoder paths. No test oracle is needed (CPU: test_fastpath_soundness.py).
"""
from __future__ import annotations

import pytest
import torch

from engine import fastpath

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_math(fresh_fastpath):
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
     torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = saved


def test_the_key_names_this_gpu():
    env = fastpath.environment(DEV)
    props = torch.cuda.get_device_properties(DEV)
    print(env)
    assert env["sm_count"] == str(props.multi_processor_count)
    assert env["mig"] == "none" or env["mig"].startswith("MIG")
    assert env["triton"] != "absent" and env["cudnn"] != "None"
    assert env["cublas"].count(".") == 2 and not env["cublas"].startswith("cuda"), env["cublas"]   # cuBLAS's own


@pytest.mark.parametrize("size", ["tiny", "released"])
def test_mimi_chosen_orders_replayed_in_graphs_equal_the_reference(size):
    from engine.models.mimi import fastpaths as FP
    from engine.models.mimi import weights as W
    from engine.models.mimi.config import preset
    from engine.models.mimi.model import MimiDecoder
    cfg = preset(size)
    model = MimiDecoder(cfg).to(DEV).load_moshi_state(W.random_state(cfg, seed=5))
    verdicts = FP.choose(model, DEV, 8)
    print("\n".join(v.line() for v in verdicts))
    assert verdicts[0].chosen, verdicts[0].line()                             # layer-major order: exact on CUDA
    codes = torch.randint(0, cfg.bins, (8, 37), generator=torch.Generator().manual_seed(77)).to(DEV)
    ref = FP.decode_trial(model, codes, **FP.REFERENCE)                       # eager, frame by frame
    got = FP.decode_trial(model, codes, graphs=True)                         # the chosen order, in graphs
    assert ref["audio"].abs().max() > 1e-4
    assert torch.equal(got["audio"], ref["audio"])
    assert all(torch.equal(got["state"][k], ref["state"][k]) for k in ref["state"])
    short = FP.decode_trial(model, codes[:, :17], frames=[12, 5])            # a short last second: checked first
    assert 5 in model.chosen_at and any("(5-frame second)" in v.path for v in verdicts)
    assert torch.equal(short["audio"], FP.decode_trial(model, codes[:, :17], frames=[12, 5], **FP.REFERENCE)["audio"])


@pytest.mark.parametrize("size", ["tiny", "released"])
def test_codec_chosen_batched_calls_replayed_in_graphs_equal_the_reference(size):
    from engine.models.nemotron_codec import fastpaths as NF
    from engine.models.nemotron_codec import weights as W
    from engine.models.nemotron_codec.config import PRESETS
    from engine.models.nemotron_codec.model import NemotronCodecDecoder
    cfg = PRESETS[size]
    model = NemotronCodecDecoder(cfg)
    W.load_into(model, W.check_state(W.random_state(cfg, 7), cfg, "test"))
    model = model.to(DEV)
    verdicts = NF.choose(model, DEV)
    print("\n".join(v.line() for v in verdicts))
    codes = torch.randint(0, cfg.codebook_size, (cfg.num_quantizers, 25),
                          generator=torch.Generator().manual_seed(78)).to(DEV)
    ref = NF.decode_trial(model, codes, frozenset())
    got = NF.decode_trial(model, codes, model.chosen, graphs=True)
    assert ref["audio"].abs().max() > 0
    assert torch.equal(got["audio"], ref["audio"])
    assert all(torch.equal(got["state"][k], ref["state"][k]) for k in ref["state"])


def test_step_audio2_chosen_paths_replayed_in_graphs_equal_the_reference():
    from engine.models.step_audio2 import weights as W
    from engine.models.step_audio2.config import preset
    cfg = preset("tiny")
    model = W.build(cfg, W.random_state_dict(cfg, 3), "cuda")
    verdicts = model.check_fast_paths(40)
    print("\n".join(v.line() for v in verdicts))
    fused = [v for v in verdicts if "fused elementwise" in v.path and v.chosen]
    assert all(v.line().split(" — ")[0].endswith("on (inside captured graphs only)") for v in fused)
    blocks = {"encoder": model.flow.encoder.checked, "DiT": model.flow.decoder.estimator.checked,
              "HiFT": model.hift.checked}
    compared = 0
    for name, checked in blocks.items():
        for shape, got in checked.checked.items():
            for path, v in got.items():
                if not v.chosen:
                    continue
                ref = checked.run(shape, path, False, DEV, ("eager",))["eager"]
                cand = checked.run(shape, path, True, DEV, ("graph",))["graph"]
                assert len(ref) == len(cand) and all(torch.equal(a, b) for a, b in zip(ref, cand)), v.line()
                compared += 1
    print(f"{compared} chosen (path, length) pairs equal the eager reference inside captured graphs")
