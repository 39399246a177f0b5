"""One kernel for ``(p [+ bias]) * q + r`` with the stock's roundings: the DiT's modulations and gated residuals.

Every DiT block does, in the stock's order, ``x * (1 + scale) + shift`` three times and ``x + gate * y`` three
times, each as two PyTorch kernels (a multiply, then an add, each rounded to fp32), and adds the conv block's
second bias in a third. :func:`mul_add` does the same operations in the same order in one kernel:
``t = p + bias`` (rounded), ``t = t * q`` (rounded), ``out = t + r`` (rounded). The kernel is compiled with
floating-point contraction off (``enable_fp_fusion=False``: no multiply-add fused into an FMA, which would
round once instead of twice), so each result is the same float the two or three PyTorch kernels give; IEEE
multiplication and addition are commutative, so operand order within one operation does not matter.

This is a GPU-only path (Triton) that the DiT runs only after its start-up self-check proved the block
``torch.equal`` on this GPU (:class:`.checked.CheckedPaths`); :func:`available` says why it cannot run where
it cannot. ``out`` may be a strided view (the conv block writes its input straight after the cached frames).

Triton is optional and never needed to start: it is imported, and the kernels defined, on first use (:func:`_load`).
``@triton.jit`` reads each kernel's source text when it is defined, which a frozen app (PyInstaller keeps bytecode
only) or a stripped install lacks; then, or without Triton, the path is off with its reason, logged once.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Optional

import torch

log = logging.getLogger("engine.step_audio2")

BLOCK = 1024
#: also run the fused kernel in eager steps (tests); by default only while a CUDA graph is being captured
EAGER = False

triton = tl = None                             # set by _load(): a CUDA build of PyTorch brings Triton, a CPU build not
_kernels: Optional[SimpleNamespace] = None     # the jitted kernels once defined
_why_not: Optional[str] = None                 # why they cannot be, once a definition failed


def available(device: torch.device) -> Optional[str]:
    """None when :func:`mul_add` can run on ``device``, else why not (a self-check's ``not_applicable``)."""
    if device.type != "cuda":
        return "a CUDA kernel (Triton)"
    return _load()


def _load() -> Optional[str]:
    """Import Triton and define the kernels, once: None when they are defined, else why not (logged once)."""
    global triton, tl, _kernels, _why_not
    if _kernels is None and _why_not is None:
        try:
            import triton as _triton
            import triton.language as _tl
        except ImportError:
            _why_not = "Triton is not installed"
        else:
            triton, tl = _triton, _tl
            try:
                _kernels = _define_kernels()
            except Exception as e:             # e.g. no source text for @triton.jit in a frozen app
                _why_not = f"Triton cannot define its kernels here ({type(e).__name__}: {e})"
        if _why_not is not None:
            log.warning("step-audio2 fused elementwise: off, %s; PyTorch's kernels run instead (same bits)",
                        _why_not)
    return _why_not


def _ready() -> SimpleNamespace:
    """The kernels; a RuntimeError naming why not where they cannot be defined (callers check :func:`available`)."""
    why = _load()
    if why is not None:
        raise RuntimeError(f"the fused elementwise kernel cannot run: {why}")
    return _kernels


def worth_it(device: torch.device) -> bool:
    """Whether a step should take the fused kernel now: while a CUDA graph is captured (its replay counts GPU time
    only, and there one kernel beats two). An eager step is bound by the host, and Triton's Python launcher costs
    more host time per launch than PyTorch's two kernels do (measured on the H200: the eager ``demand`` mode went
    from 183 to 214 ms per chunk), so eager steps keep PyTorch's kernels: the same bits either way."""
    if EAGER:
        return True
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _define_kernels() -> SimpleNamespace:
    """Jit both kernels (Triton reads their source text here)."""
    @triton.jit(do_not_specialize=["n", "T", "C", "sp_b", "sp_t", "sp_c", "sq_b", "sq_t", "sq_c",
                                   "sr_b", "sr_t", "sr_c", "so_b", "so_t", "so_c"])
    def _mul_add_kernel(out_ptr, p_ptr, bias_ptr, q_ptr, r_ptr, n, T, C,
                        sp_b, sp_t, sp_c, sq_b, sq_t, sq_c, sr_b, sr_t, sr_c, so_b, so_t, so_c,
                        HAS_BIAS: tl.constexpr, SQUARE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n
        c = offs % C                            # [B, T, C] element of each flat index
        bt = offs // C
        t = bt % T
        b = bt // T
        p = tl.load(p_ptr + b * sp_b + t * sp_t + c * sp_c, mask=mask)
        if HAS_BIAS:
            p = p + tl.load(bias_ptr + c, mask=mask)
        if SQUARE:
            p = p * p
        q = tl.load(q_ptr + b * sq_b + t * sq_t + c * sq_c, mask=mask)
        r = tl.load(r_ptr + b * sr_b + t * sr_t + c * sr_c, mask=mask)
        tl.store(out_ptr + b * so_b + t * so_t + c * so_c, p * q + r, mask=mask)

    @triton.jit(do_not_specialize=["n", "C", "P", "L", "sc_b", "sc_c", "sc_l", "sp_b", "sp_t", "sp_c",
                                   "sq_b", "sq_c", "sr_b", "sr_c"])
    def _after_cache_kernel(out_ptr, cache_ptr, p_ptr, q_ptr, r_ptr, n, C, P, L, sc_b, sc_c, sc_l,
                            sp_b, sp_t, sp_c, sq_b, sq_c, sr_b, sr_c, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n
        j = offs % L                            # out [B, C, L] contiguous, L = P + T
        bc = offs // L
        c = bc % C
        b = bc // C
        cached = mask & (j < P)
        new = mask & (j >= P)
        old = tl.load(cache_ptr + b * sc_b + c * sc_c + j * sc_l, mask=cached)
        p = tl.load(p_ptr + b * sp_b + (j - P) * sp_t + c * sp_c, mask=new)
        q = tl.load(q_ptr + b * sq_b + c * sq_c, mask=new)
        r = tl.load(r_ptr + b * sr_b + c * sr_c, mask=new)
        tl.store(out_ptr + offs, tl.where(j < P, old, p * q + r), mask=mask)

    return SimpleNamespace(mul_add=_mul_add_kernel, after_cache=_after_cache_kernel)


def after_cache(cache: torch.Tensor, p: torch.Tensor, q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``cat([cache, (p * q + r).transpose(1, 2)], dim=2)`` in one kernel, each value as PyTorch gives it (the
    cached frames copied bit for bit, the new ones with the two roundings): ``cache`` ``[B, C, P]``, ``p``
    ``[B, T, C]``, ``q``, ``r`` ``[B, 1, C]``. Returns ``[B, C, P + T]`` (contiguous): a causal conv's input."""
    b, t, c = p.shape
    k = cache.shape[2]
    if p.dtype != torch.float32 or cache.shape[:2] != (b, c) or q.shape != (b, 1, c) or r.shape != (b, 1, c):
        raise ValueError(f"after_cache: cache {tuple(cache.shape)}, p {tuple(p.shape)}, q {tuple(q.shape)}, "
                         f"r {tuple(r.shape)} do not fit [B, C, P], [B, T, C], [B, 1, C]")
    kernel = _ready().after_cache
    out = torch.empty(b, c, k + t, dtype=p.dtype, device=p.device)
    n = out.numel()
    kernel[(triton.cdiv(n, BLOCK),)](
        out, cache, p, q, r, n, c, k, k + t, *cache.stride(), *p.stride(), q.stride(0), q.stride(2),
        r.stride(0), r.stride(2), BLOCK_SIZE=BLOCK, num_warps=4, enable_fp_fusion=False)
    return out


def mul_add(p: torch.Tensor, q: torch.Tensor, r: torch.Tensor, bias: Optional[torch.Tensor] = None,
            out: Optional[torch.Tensor] = None, square: bool = False) -> torch.Tensor:
    """``(p + bias) * q + r`` elementwise over ``[B, T, C]`` (``q``, ``r`` broadcast to ``p``'s shape; ``bias``
    ``[C]``), each operation rounded as PyTorch's own kernels round it. ``square``: ``p * p`` stands for ``p``
    (after the bias): the Snake activation's ``x + inv * sin(alpha x) ** 2`` from its sine (PyTorch squares by a
    multiply). Returns ``out`` (new: contiguous)."""
    shape = p.shape
    if p.dim() != 3 or p.dtype != torch.float32:
        raise ValueError(f"mul_add takes float32 [B, T, C] tensors, got {tuple(shape)} {p.dtype}")
    kernel = _ready().mul_add
    q, r = q.broadcast_to(shape), r.broadcast_to(shape)
    if out is None:
        out = torch.empty(shape, dtype=p.dtype, device=p.device)
    elif out.shape != shape:
        raise ValueError(f"mul_add: out is {tuple(out.shape)}, the result {tuple(shape)}")
    n = p.numel()
    kernel[(triton.cdiv(n, BLOCK),)](
        out, p, bias if bias is not None else p, q, r, n, shape[1], shape[2], *p.stride(), *q.stride(),
        *r.stride(), *out.stride(), HAS_BIAS=bias is not None, SQUARE=square, BLOCK_SIZE=BLOCK, num_warps=4,
        enable_fp_fusion=False)
    return out


def mul_add_reference(p: torch.Tensor, q: torch.Tensor, r: torch.Tensor,
                      bias: Optional[torch.Tensor] = None, square: bool = False) -> torch.Tensor:
    """The same, as PyTorch's separate kernels compute it (the stock's ops)."""
    if bias is not None:
        p = p + bias
    if square:
        p = torch.pow(p, 2)
    return p * q + r
