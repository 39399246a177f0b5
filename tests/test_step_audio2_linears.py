"""The DiT's split-K linears (:mod:`engine.models.step_audio2.linears`).

On the CPU: bad operands get one clear error before any kernel runs; under Triton's interpreter (when Triton is
installed) the kernel's indexing, masks, split ranges and gated epilogue give ``F.linear``'s values to float32
precision (the interpreter's ``tl.dot`` is NumPy's, so the summation order, and with it the exact bits, is only
provable on the GPU). On CUDA (``-m gpu``): ``torch.equal`` to cuBLAS at the DiT's steady shapes, and a planted
error (two k ranges instead of four) is told apart.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import oracles

from engine.models.step_audio2 import linears

ROOT = Path(__file__).resolve().parents[1]


def test_bad_operands_get_one_clear_error():
    w, b = torch.randn(512, 512), torch.randn(512)
    wt = linears.transposed(w)
    assert wt.shape == (512, 512) and wt.is_contiguous() and torch.equal(wt, w.t())
    with pytest.raises(ValueError, match="split-K linear: float32 only"):
        linears.linear(torch.randn(2, 5, 512, dtype=torch.float64), wt, b)
    step = linears.SPLITS * linears.BK
    with pytest.raises(ValueError, match=f"k must be a multiple of {step}"):
        linears.linear(torch.randn(2, 5, step + 8), linears.transposed(torch.randn(512, step + 8)), b)
    with pytest.raises(ValueError, match="the transposed weight must be contiguous"):
        linears.linear(torch.randn(2, 5, 512), w.t(), b)
    with pytest.raises(ValueError, match=r"gate \(2, 5, 512\) / residual None do not fit"):
        linears.linear(torch.randn(2, 5, 512), wt, b, gate=torch.randn(2, 5, 512))
    assert linears.fits(torch.randn(2, 5, 512), wt) is None
    assert linears.available(torch.device("cpu")) == "a CUDA kernel (Triton)"


INTERPRETED = r'''
import torch
from engine.models.step_audio2 import fused, linears
assert fused._load() is None, fused._load()
g = torch.Generator().manual_seed(7)
for rows_t, k, n in [((2, 50), 512, 512), ((1, 19), 2048, 48), ((1, 3), 512, 80)]:
    x = torch.randn(*rows_t, k, generator=g)
    w, b = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g)
    gate, res = torch.randn(rows_t[0], 1, n, generator=g), torch.randn(*rows_t, n, generator=g)
    wt = linears.transposed(w)
    for got, ref in [(linears.linear(x, wt, b), linears.reference(x, w, b)),
                     (linears.linear(x, wt, b, gate, res), linears.reference(x, w, b, gate, res))]:
        assert got.shape == ref.shape, (got.shape, ref.shape)
        err = (got - ref).abs().max().item()
        assert err < 2e-5, (rows_t, k, n, err)
print("LINEARS-OK")
'''


def test_interpreted_kernel_gives_the_linear_s_values():
    oracles.require(oracles.TRITON)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", INTERPRETED], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and "LINEARS-OK" in run.stdout, run.stderr[-3000:]


@pytest.mark.gpu
def test_split_k_linear_is_bit_identical_to_cublas_at_the_dit_s_shapes():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if linears.available(torch.device("cuda")):
        pytest.skip(linears.available(torch.device("cuda")))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False              # the stock's fp32 linears
    try:
        g = torch.Generator(device="cuda").manual_seed(19)
        for t in (50, 58):
            for k in (512, 2048):
                x = torch.randn(2, t, k, device="cuda", generator=g)
                w = torch.randn(512, k, device="cuda", generator=g) / k ** 0.5
                b = torch.randn(512, device="cuda", generator=g)
                gate = torch.randn(2, 1, 512, device="cuda", generator=g)
                res = torch.randn(2, t, 512, device="cuda", generator=g)
                wt = linears.transposed(w)
                assert torch.equal(linears.linear(x, wt, b), linears.reference(x, w, b)), (t, k)
                assert torch.equal(linears.linear(x, wt, b, gate, res), linears.reference(x, w, b, gate, res)), (t, k)
                assert not torch.equal(linears.linear(x, wt, b, splits=2), linears.reference(x, w, b)), (t, k)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_dit_block_keeps_transposed_weights_in_step_with_its_weights():
    from engine.models.step_audio2.dit import DiTBlock
    torch.manual_seed(3)
    blk = DiTBlock(64, 2, 32, 2.0)
    assert not blk.has_transposed()
    blk.build_transposed()
    assert blk.has_transposed()
    for layer in blk.own_layers():
        assert torch.equal(layer.weight_t, layer.weight.t()) and layer.weight_t.is_contiguous()
    assert blk.mlp.fc2.weight_t.shape == (128, 64)
    with torch.no_grad():
        blk.mlp.fc2.weight.add_(1.0)                   # new weights (a load): the copies are stale
    assert not blk.has_transposed()
    blk.build_transposed()
    assert blk.has_transposed() and torch.equal(blk.mlp.fc2.weight_t, blk.mlp.fc2.weight.t())
    assert "weight_t" not in blk.state_dict() and not any("weight_t" in k for k in blk.state_dict())
    blk.drop_transposed()
    assert not blk.has_transposed() and not hasattr(blk.attn.to_q, "weight_t")


def test_transposed_weights_of_an_inference_mode_block():
    """Weights made under ``torch.inference_mode`` keep no version counter: the copies follow their storage."""
    from engine.models.step_audio2.dit import DiTBlock
    with torch.inference_mode():
        blk = DiTBlock(64, 2, 32, 2.0)
        blk.build_transposed()
        assert blk.has_transposed() and torch.equal(blk.attn.proj.weight_t, blk.attn.proj.weight.t())
