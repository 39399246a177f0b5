"""The DiT's fp32 linears in two kernels each, summed in the order cuBLAS's split-K kernel sums them.

At the steady chunk lengths (the CFG pair of a 50- or 58-frame chunk: 100 or 116 rows) cuBLAS runs each of
the DiT's 512-wide projections (q, k, v, the attention's output, the MLP's second layer) as four kernels: a
memset, a ``scal`` zeroing the output, the split-K SIMT GEMM ``sgemm_largek`` and a cuBLASLt bias epilogue:
807 GEMMs, ~3,200 kernels of a chunk's 8,918. A probe on the H200 (kept in the project's history)
found the arithmetic those four kernels do, by searching split counts,
k layouts and reduction orders for the one that is ``torch.equal`` at every such shape: the k axis is cut into
**four contiguous ranges**; each output's partial sum over a range is a chain of fused multiply-adds in
ascending k starting from zero; the four partials are added **in range order** onto the zeroed output, each
addition rounded; the bias is added last. (With one range the chain is the non-split ``ffma`` kernels'.)

:func:`linear` does that arithmetic in two Triton kernels: the four ranges' partial sums side by side (one
program per tile and range), then their ordered reduction with the bias, optionally finished with the block's
gated residual ``(y + bias) * gate + r`` (each operation rounded, as the separate kernels round it), which saves
the next kernel as well. (One kernel that ran the four ranges in turn kept the bits but took 21-71 us a call on
the H200 against cuBLAS's 20-35: the ranges must run side by side, as cuBLAS runs them.)

The weight is read **transposed**, ``[K, N]`` with N contiguous (:func:`transposed`: one copy per weight, made
once, before any capture), so each k step's weight tile is loaded along contiguous columns. Read from the
``[N, K]`` weight the same kernel took 15 us at k = 512 and 49 us at k = 2,048 (cuBLAS: 20 and 35); from the
transposed copy, 6.6 and 15.7 us with the reduction (a probe on the H200: 240 tile /
pipelining / layout variants, all ``torch.equal``). So the DiT runs all five of a block's 512-wide linears
(q, k, v, the attention's output and the MLP's second layer) this way, at 8 MB more per block (fp32 copies:
128 MB at the released depth of 16; the bench measured 1,304 MiB kept against 1,174 on the reference paths).

``tl.dot`` with ``input_precision="ieee"`` lowers to a chain of FMAs in ascending k; the kernels are compiled
with floating-point contraction off, so the reduction and epilogue adds stay separate roundings. Whether cuBLAS picks the split-K kernel at a shape is its heuristic's choice on that GPU and
library, so the DiT runs this path only at chunk lengths where its start-up self-check proved the block
``torch.equal`` (:class:`.checked.CheckedPaths`), and only inside captured graphs (as :mod:`.fused`: Triton's
launcher costs host time an eager step does not have).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from . import fused

#: k ranges summed separately (cuBLAS's split-K at the DiT's steady shapes, found by the probe)
SPLITS = 4
#: the partial sums' tile (rows, columns, k step), warps and pipeline stages: the fastest at k = 512 of a
#: probe's 240 variants on the H200 (6.6 us at 116 x 512 x 512, 15.7 at k = 2,048, the reduction included)
BM, BN, BK, WARPS, STAGES = 16, 64, 32, 4, 3
#: elements per program of the reduction
REDUCE_BLOCK = 1024

_kernels: Optional[SimpleNamespace] = None


def available(device: torch.device) -> Optional[str]:
    """None when :func:`linear` can run on ``device``, else why not (a self-check's ``not_applicable``)."""
    return fused.available(device)


def _ready() -> SimpleNamespace:
    global _kernels
    if _kernels is None:
        fused._ready()                                  # imports Triton (a RuntimeError naming why not if absent)
        _kernels = _define(fused.triton, fused.tl)
    return _kernels


def _define(triton, tl) -> SimpleNamespace:
    @triton.jit(do_not_specialize=["M", "N", "K", "sx_m"])
    def _partials_kernel(x_ptr, wt_ptr, p_ptr, M, N, K, sx_m,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """One k range's partial sums (program axis 2 picks the range): an FMA chain in ascending k from 0."""
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        s = tl.program_id(2)
        ks = tl.arange(0, BK)
        row_ok = rows < M
        col_ok = cols < N
        per = K // tl.num_programs(2)
        part = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(s * per, (s + 1) * per, BK):
            a = tl.load(x_ptr + rows[:, None] * sx_m + (k0 + ks)[None, :], mask=row_ok[:, None], other=0.0)
            b = tl.load(wt_ptr + (k0 + ks)[:, None] * N + cols[None, :], mask=col_ok[None, :], other=0.0)
            part = tl.dot(a, b, part, input_precision="ieee")
        tl.store(p_ptr + (s * M + rows[:, None]) * N + cols[None, :], part,
                 mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit(do_not_specialize=["n", "M", "N", "T", "sg_b", "sr_b", "sr_t"])
    def _reduce_kernel(p_ptr, b_ptr, out_ptr, g_ptr, r_ptr, n, M, N, T, sg_b, sr_b, sr_t,
                       SPLITS: tl.constexpr, GATED: tl.constexpr, BLOCK: tl.constexpr):
        """The partials added in range order onto zero, then the bias (then ``* gate + residual``), each rounded."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        col = offs % N
        y = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLITS):
            y = y + tl.load(p_ptr + s * M * N + offs, mask=ok, other=0.0)
        y = y + tl.load(b_ptr + col, mask=ok, other=0.0)
        if GATED:
            row = offs // N
            bt = row // T
            tt = row % T
            y = y * tl.load(g_ptr + bt * sg_b + col, mask=ok, other=0.0) \
                + tl.load(r_ptr + bt * sr_b + tt * sr_t + col, mask=ok, other=0.0)
        tl.store(out_ptr + offs, y, mask=ok)

    return SimpleNamespace(partials=_partials_kernel, reduce=_reduce_kernel)


def transposed(weight: torch.Tensor) -> torch.Tensor:
    """The ``[K, N]`` contiguous copy of a linear's ``[N, K]`` weight that :func:`linear` reads."""
    return weight.detach().t().contiguous()


def fits(x: torch.Tensor, weight_t: torch.Tensor, splits: int = SPLITS) -> Optional[str]:
    """None when :func:`linear` takes these operands (``weight_t`` from :func:`transposed`), else why not."""
    k = weight_t.shape[0]
    if x.dtype != torch.float32 or weight_t.dtype != torch.float32:
        return f"float32 only (x {x.dtype}, weight {weight_t.dtype})"
    if x.shape[-1] != k or k % (splits * BK):
        return f"k {x.shape[-1]} vs transposed weight {tuple(weight_t.shape)}: k must be a multiple of {splits * BK}"
    if x.stride(-1) != 1 or not weight_t.is_contiguous():
        return "x needs unit stride along k and the transposed weight must be contiguous"
    return None


def linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor, gate: Optional[torch.Tensor] = None,
           residual: Optional[torch.Tensor] = None, splits: int = SPLITS) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` over ``x`` ``[B, T, K]``, given ``weight_t = transposed(weight)``, summed as
    cuBLAS's split-K kernel sums it (module docstring); with ``gate`` ``[B, 1, N]`` and ``residual`` ``[B, T, N]``:
    ``linear(...) * gate + residual``, each operation rounded. Returns a new contiguous ``[B, T, N]``."""
    why = fits(x, weight_t, splits)
    if why is not None:
        raise ValueError(f"split-K linear: {why}")
    b, t, k = x.shape
    n = weight_t.shape[1]
    x2 = x.reshape(b * t, k)                           # a view for the DiT's contiguous activations
    out = torch.empty(b, t, n, dtype=x.dtype, device=x.device)
    gated = gate is not None
    if gated and (gate.shape != (b, 1, n) or residual is None or residual.shape != (b, t, n)
                  or gate.stride(2) != 1 or residual.stride(2) != 1):
        raise ValueError(f"split-K linear: gate {tuple(gate.shape)} / residual "
                         f"{None if residual is None else tuple(residual.shape)} do not fit [B, 1, N] / [B, T, N]")
    g, r = (gate, residual) if gated else (out, out)
    kern = _ready()
    triton = fused.triton
    m = b * t
    parts = torch.empty(splits, m, n, dtype=x.dtype, device=x.device)
    kern.partials[(triton.cdiv(m, BM), triton.cdiv(n, BN), splits)](
        x2, weight_t, parts, m, n, k, x2.stride(0), BM=BM, BN=BN, BK=BK, num_warps=WARPS, num_stages=STAGES,
        enable_fp_fusion=False)
    kern.reduce[(triton.cdiv(m * n, REDUCE_BLOCK),)](
        parts, bias, out, g, r, m * n, m, n, t, g.stride(0), r.stride(0), r.stride(1), SPLITS=splits, GATED=gated,
        BLOCK=REDUCE_BLOCK, num_warps=4, enable_fp_fusion=False)
    return out


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, gate: Optional[torch.Tensor] = None,
              residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The same, as the stock computes it (cuBLAS's linear, then PyTorch's multiply and add)."""
    y = torch.nn.functional.linear(x, weight, bias)
    return y if gate is None else y * gate + residual
