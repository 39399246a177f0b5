"""Step-Audio2's optional faster paths: each runs only where its start-up self-check proved it
bit-identical, and what each does besides the library call it depends on is exact (CPU).

* frames-major (channels-last) DiT conv blocks: on the CPU the channels-last convolution itself sums in
  another order (the check refuses it, as it must); with a convolution that ignores memory layout, the
  block's own wiring (cache in and out, the modulation's add and the Mish written in place) is proven
  bit-identical to the stock layout, block by block and over a whole stream against the stock package;
* parallel lanes (CUDA streams): not applicable on the CPU; the branches then run in order;
* fused elementwise (a Triton kernel for ``a * b + c`` with two roundings): not applicable on the CPU; its
  arithmetic and indexing are proven over a whole stream by Triton's interpreter (when Triton is installed);
* the verdicts reach the session info; ``use_reference_paths`` (the bench's "before") checks nothing.
"""
import pytest
import torch
import torch.nn.functional as F

import oracles

from engine import fastpath
from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.checked import CheckedPaths
from engine.models.step_audio2.config import preset
from engine.models.step_audio2.lanes import fork, parallel
from engine.models.step_audio2.stream import synthesize

_conv1d = F.conv1d


def layout_blind_conv1d(x, w, *args, **kwargs):
    """A convolution whose sums do not depend on the operands' memory layout (contiguous copies first)."""
    return _conv1d(x.contiguous(), w.contiguous(), *args, **kwargs)


@pytest.fixture
def fresh_verdicts():
    fastpath.clear_cache()
    yield
    fastpath.clear_cache()


@pytest.fixture(scope="module")
def model():
    cfg = preset("oracle")
    return W.build(cfg, W.random_state_dict(cfg, 0), "cpu")


def test_cpu_refuses_channels_last_convs_and_lanes_with_reasons(model, fresh_verdicts, one_torch_thread):
    dit = model.flow.decoder.estimator
    dit.checked.clear()
    off = {"frames-major convs": False, "parallel lanes": False, "fused elementwise": False,
           "split-K linears": False}
    assert dit.fast(50) == off
    fm, lanes, fused, own = dit.verdicts()
    assert fm.path == "step-audio2 DiT frames-major convs (50 frames)"
    assert "max abs diff" in fm.reason and fm.max_abs_diff > 0          # the CPU's channels-last conv sums otherwise
    assert lanes.reason == "not applicable: CUDA streams only"
    assert fused.reason.startswith("not applicable: ")                  # a CUDA kernel (Triton)
    assert own.reason == fused.reason
    assert dit.fast(50) == off
    assert len(dit.verdicts()) == 4                                      # checked once per length


def test_frames_major_block_equals_the_stock_layout_block(model, fresh_verdicts, monkeypatch, one_torch_thread):
    monkeypatch.setattr(F, "conv1d", layout_blind_conv1d)
    dit = model.flow.decoder.estimator
    dit.checked.clear()
    assert dit.fast(7)["frames-major convs"], dit.verdicts()[0].line()
    assert all(blk.conv.weights_cl for blk in dit.blocks)              # prepared for every block when chosen
    conv = dit.blocks[1].conv
    g = torch.Generator().manual_seed(5)
    for t in (1, 2, 50):
        scaled, shift = torch.randn(2, t, 512, generator=g), torch.randn(2, 1, 512, generator=g)
        cache = torch.randn(2, 1024, 2, generator=g)
        c_ref, c_new = cache.clone(), cache.clone()
        ref = conv(scaled + shift, c_ref)
        out = conv.forward_frames_major(scaled, shift, c_new)
        assert out.shape == ref.shape == (2, t, 512)
        assert torch.equal(out, ref), t
        assert torch.equal(c_new, c_ref), t


def test_stream_with_frames_major_convs_is_bit_identical_to_the_stock_package(fresh_verdicts, monkeypatch,
                                                                              one_torch_thread):
    oracles.require(oracles.STEPAUDIO2)
    import stock_step_audio2 as S
    case = S.make_case("oracle", prompt_tokens=21, n_tokens=61)
    ref = S.stock_outputs(case)                                         # its convs see contiguous operands
    monkeypatch.setattr(F, "conv1d", layout_blind_conv1d)
    model = W.build(case.cfg, case.state, "cpu")
    with torch.no_grad():
        ours = synthesize(model, case.prompt, case.tokens, "demand", case.seed)
    chosen = [v for v in model.verdicts() if v.chosen]
    assert {v.path for v in chosen} == {f"step-audio2 DiT frames-major convs ({t} frames)" for t in (42, 50, 22)}
    S.assert_chunks_equal(ours, ref)


def test_reference_paths_check_nothing(fresh_verdicts, one_torch_thread):
    cfg = preset("oracle")
    m = W.build(cfg, W.random_state_dict(cfg, 1), "cpu").use_reference_paths()
    verdicts = m.check_fast_paths(40)
    assert [v.path for v in verdicts] == [
        f"step-audio2 encoder parallel lanes ({t} frames)" for t in (20, 25, 40, 50)] + [
        f"step-audio2 DiT {p} ({t} frames)" for t in (40, 50)
        for p in ("frames-major convs", "parallel lanes", "fused elementwise", "split-K linears")] + [
        f"step-audio2 HiFT {p} ({t} frames)" for t in (50, 58) for p in ("parallel lanes", "fused elementwise")]
    assert all(not v.chosen and v.reason == "reference path asked for" for v in verdicts)


def test_checked_paths_choose_only_bit_identical_candidates(fresh_verdicts):
    calls = []

    def trial(shape, path, on, inputs):
        calls.append((shape, path, on))
        x, = inputs
        return [x * 3 if path == "same" or not on else x * 3 + 1e-6 * x]

    cp = CheckedPaths("toy", ("same", "ulp"), trial, lambda shape, path: [torch.arange(1.0, shape + 1.0)])
    assert cp.which(4, torch.device("cpu"), "cfg") == {"same": True, "ulp": False}
    assert cp.which(4, torch.device("cpu"), "cfg") == {"same": True, "ulp": False}
    assert len([c for c in calls if c[0] == 4]) == 5                     # same: 2 trials; ulp: 2 + the repeat
    same, ulp = cp.verdicts()
    assert same.line().startswith("toy same (4 frames): on") and "max abs diff" in ulp.reason


def test_a_chosen_path_is_prepared_once_per_checked_shape(fresh_verdicts):
    """``prepare`` (what a chosen path reads, e.g. the DiT's transposed weights) runs when a shape's check chooses
    the path, never for a refused path and never again for a shape already checked."""
    prepared = []

    def trial(shape, path, on, inputs):
        x, = inputs
        return [x * 3 if path == "same" or not on else x * 3 + 1e-6 * x]

    cp = CheckedPaths("toy", ("same", "ulp"), trial, lambda shape, path: [torch.arange(1.0, shape + 1.0)],
                      prepare=prepared.append)
    cp.which(4, torch.device("cpu"), "cfg")
    cp.which(4, torch.device("cpu"), "cfg")
    assert prepared == ["same"]
    cp.which(6, torch.device("cpu"), "cfg")
    assert prepared == ["same", "same"]


def test_lanes_run_in_order_off_cuda():
    order = []
    out = parallel([lambda: order.append(0) or 0, lambda: order.append(1) or 1], torch.device("cpu"))
    assert out == [0, 1] and order == [0, 1]
    f = fork(lambda: order.append(2) or 2, torch.device("cpu"), 3)
    assert order == [0, 1, 2] and f.join() == 2


FUSED_SCRIPT = r'''
import sys, torch, torch.nn.functional as F
torch.set_num_threads(1)
sys.path[:0] = [".", "tests"]
_conv1d = F.conv1d
def conv1d(x, w, b=None, *a, **k):            # layout-blind, bias added as PyTorch's cuDNN path adds it
    y = _conv1d(x.contiguous(), w.contiguous(), None, *a, **k)
    return y if b is None else y + b.view(1, -1, 1)
F.conv1d = conv1d
from engine import fastpath
from engine.models.step_audio2 import dit as D, hift as H, weights as W
from engine.models.step_audio2.stream import synthesize
D.fused_available = H.fused_available = lambda device: None   # Triton's interpreter runs the kernel on the CPU
from engine.models.step_audio2 import fused as FU
FU.BLOCK = 1 << 16                            # interpreted: one program per call (values unchanged)
FU.EAGER = True                               # the fused kernel in eager steps too (by default: in captures)
import stock_step_audio2 as S
case = S.make_case("oracle", prompt_tokens=21, n_tokens=50)
ref = S.stock_outputs(case)
model = W.build(case.cfg, case.state, "cpu")
est = model.flow.decoder.estimator
assert est.fast(50)["fused elementwise"], est.verdicts()
with torch.no_grad():
    ours = synthesize(model, case.prompt, case.tokens, "demand", case.seed)
fused = sorted(v.path for v in model.verdicts() if v.chosen and "fused" in v.path)
assert fused == [f"step-audio2 DiT fused elementwise ({t} frames)" for t in (42, 50)] + [
    f"step-audio2 HiFT fused elementwise ({t} frames)" for t in (50, 58)], fused
S.assert_chunks_equal(ours, ref)
print("FUSED-OK")
'''


def test_fused_elementwise_stream_is_bit_identical_to_the_stock_package(tmp_path):
    """The Triton kernel's arithmetic and indexing, run by Triton's interpreter on the CPU, over a whole stream
    with every DiT block and every HiFT Snake on the fused path: torch.equal to the stock package chunk by chunk."""
    oracles.require(oracles.TRITON, oracles.STEPAUDIO2)
    import stock_step_audio2 as S
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{root}:{root / 'tests'}")
    run = subprocess.run([sys.executable, "-c", FUSED_SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "FUSED-OK" in run.stdout, run.stderr[-3000:]


def test_the_tail_reports_its_verdicts_for_the_session_info(fresh_verdicts, one_torch_thread):
    from engine.models.step_audio2 import make_tail
    tail = make_tail("tiny", "cpu", seed=2, mode="demand")
    assert tail.fast_paths() == []                                       # nothing checked before a stream starts
    tail.start(seed=2)
    lines = [v.line() for v in tail.fast_paths()]
    assert any(x.startswith("step-audio2 DiT parallel lanes (50 frames): off") for x in lines), lines
    assert {x.split(" (")[0] for x in lines} == {
        "step-audio2 encoder parallel lanes", "step-audio2 DiT frames-major convs", "step-audio2 DiT parallel lanes",
        "step-audio2 DiT fused elementwise", "step-audio2 DiT split-K linears", "step-audio2 HiFT parallel lanes", "step-audio2 HiFT fused elementwise"}
