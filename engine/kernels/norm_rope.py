"""RMSNorm and rotate-half RoPE in fewer kernels that round exactly as the stock's chains of small ones.

The stock's RMSNorm, ``w * (x32 * rsqrt(mean(x32 ** 2) + eps)).to(bf16)`` with ``x32 = x.float()``, is eight
kernels (the cast, the square, the mean, the add, the rsqrt, the multiply, the cast back, the weight); its RoPE,
``x * cos + cat(-x2, x1) * sin``, is five. In a captured graph each is a launch of a few microseconds over a few
kilobytes: the H200 profile of a speaking second counted ~2,150 mean kernels, each with its seven neighbours.

Every one of those kernels is elementwise except the mean, so the same arithmetic fits in fewer kernels with
every value rounded where the stock rounds it:

* RMSNorm in three: the squares ``float(x) * float(x)`` (one kernel), **PyTorch's own mean** over them (the one
  reduction, whose summation order is PyTorch's, on a tensor of the same shape and layout), and
  ``bf16(float(w) * float(bf16(float(x) * rsqrt(var + eps))))`` (one kernel);
* RoPE in one: ``bf16(float(bf16(x_i * cos_i)) + float(bf16(rot_i * sin_i)))`` with ``rot_i = -x_{i+h}`` below
  the half ``h`` and ``x_{i-h}`` above it (negation is exact, so ``bf16(-a * s) == -bf16(a * s)``).
* Qwen3's per-head q/k norm followed by RoPE in three (the squares, the mean, and one kernel that makes each
  normed value and its rotation partner's, with the norm's roundings, and turns them).

Float32 products and sums are correctly rounded on every device. Rounding to bfloat16 is written out on the bits
(round to nearest even, as ``c10::BFloat16`` and CUDA's ``__float2bfloat16`` round), so the kernels give the same
bits under Triton's CPU interpreter (whose casts truncate), which the CPU tests run. The one library function is
the reciprocal square root: the stock's CUDA kernel calls ``rsqrtf``, these call libdevice's ``rsqrt``, which is
what ``rsqrtf`` compiles to; the device's start-up check (:mod:`.exact`) proves it before anything uses them.

Only bfloat16 tensors whose last dimension is contiguous go through here (the callers check
:func:`rms_norm_fits` / :func:`rope_fits`); anything else runs the stock chain.
"""
from __future__ import annotations

import functools
import os
from types import SimpleNamespace
from typing import Tuple

import torch


def rms_norm_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`rms_norm` takes ``x`` (bfloat16, contiguous) and ``weight`` (bfloat16, [D])."""
    return (x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and x.is_contiguous()
            and weight.dim() == 1 and weight.shape[0] == x.shape[-1] and weight.is_contiguous() and x.numel() > 0)


def rope_fits(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`rope` takes ``x`` [B, H, T, hd] (bfloat16, last dim contiguous, hd a power of two) with
    contiguous bfloat16 tables ``cos``/``sin`` [T, hd]."""
    if x.dim() != 4 or x.dtype != torch.bfloat16 or x.stride(-1) != 1 or x.numel() == 0:
        return False
    t, hd = x.shape[2], x.shape[3]
    tables = all(c.dtype == torch.bfloat16 and c.is_contiguous() and tuple(c.shape) == (t, hd) for c in (cos, sin))
    return (tables and hd >= 2 and hd & (hd - 1) == 0
            and _rope_layout(tuple(x.shape), tuple(x.stride()))[-1] == 1)          # written row by row


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The stock RMSNorm's bits in three kernels (see the module's text); ``x`` as :func:`rms_norm_fits` says."""
    d = x.shape[-1]
    rows, block = x.numel() // d, _pow2(d)
    var = _mean_squares(x, block)
    out = torch.empty_like(x)
    _kernels().norm_tail[(rows,)](x, var, weight, out.view(torch.int16), d, float(eps), BLOCK=block, **_LAUNCH)
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The stock rotate-half RoPE's bits in one kernel; the output has ``x``'s layout (as the stock's has)."""
    k = _kernels()
    b, h, t, hd = x.shape
    out = torch.empty_strided(x.shape, _rope_layout(tuple(x.shape), tuple(x.stride())), dtype=x.dtype,
                              device=x.device)
    so = out.stride()
    sx = x.stride()
    k.rope[(b * h * t,)](x, cos, sin, out.view(torch.int16), h, t, sx[0], sx[1], sx[2], so[0], so[1], so[2],
                         HD=hd, **_LAUNCH)
    return out


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
                  ) -> torch.Tensor:
    """``rope(rms_norm(x, weight, eps).transpose(1, 2), cos, sin)`` for a projection's heads ``x`` [B, T, H, hd]
    (Qwen3's q/k norm, then RoPE) in three kernels for four: the norm's last kernel writes the turned rows (each
    value of the normed row is made where it is needed, its partner's too, with the same roundings). Output
    [B, H, T, hd] laid out as the stock chain's."""
    b, t, h, hd = x.shape
    var = _mean_squares(x, hd)
    turned = x.transpose(1, 2)
    out = torch.empty_strided(turned.shape, _rope_layout(tuple(turned.shape), tuple(turned.stride())),
                              dtype=x.dtype, device=x.device)
    so = out.stride()
    _kernels().norm_rope[(x.numel() // hd,)](x, var, weight, cos, sin, out.view(torch.int16), h, t, float(eps),
                                             so[0], so[1], so[2], HD=hd, **_LAUNCH)
    return out


def rms_norm_rope_fits(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`rms_norm_rope` takes ``x`` [B, T, H, hd] (contiguous bfloat16) with these tables."""
    return x.dim() == 4 and rms_norm_fits(x, weight) and rope_fits(x.transpose(1, 2), cos, sin)


def _mean_squares(x: torch.Tensor, block: int) -> torch.Tensor:
    """The stock's ``x.float().pow(2).mean(-1, keepdim=True)`` of a contiguous ``x``: the squares in one kernel,
    then PyTorch's own reduction on a float32 tensor of ``x``'s shape and layout, as the stock's is."""
    d = x.shape[-1]
    squares = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _kernels().squares[(x.numel() // d,)](x, squares, d, BLOCK=block, **_LAUNCH)
    return squares.mean(-1, keepdim=True)


@functools.lru_cache(maxsize=256)
def _rope_layout(shape: Tuple[int, ...], stride: Tuple[int, ...]) -> Tuple[int, ...]:
    """The strides of the stock chain's output for an input of this layout (PyTorch's elementwise kernels
    choose them from their inputs' strides), found by running the chain on meta tensors."""
    x = torch.empty_strided(shape, stride, dtype=torch.bfloat16, device="meta")
    c = torch.empty(shape[2:], dtype=torch.bfloat16, device="meta")
    half = shape[-1] // 2
    return tuple((x * c + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * c).stride())


#: no multiply-add contracted into one FMA (which would round once where the stock rounds twice)
_LAUNCH = dict(num_warps=4, enable_fp_fusion=False)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


triton = tl = libdevice = None               # set by _define(): a CUDA build of PyTorch brings Triton, a CPU build not
_bf16_bits = _from_bits = _store_bits = _rsqrt = _turned_bits = _normed = None  # the kernels' helpers (globals)


def _define() -> SimpleNamespace:
    """Import Triton and jit the kernels (Triton reads their source text here and resolves the names they call
    among this module's globals, so the helpers are made globals first)."""
    global triton, tl, libdevice, _bf16_bits, _from_bits, _store_bits, _rsqrt, _turned_bits, _normed
    import triton as _triton
    import triton.language as _tl
    from triton.language.extra import libdevice as _libdevice
    triton, tl, libdevice = _triton, _tl, _libdevice

    @triton.jit
    def bf16_bits(v):
        """float32 -> the bits of its bfloat16, rounded to nearest even (NaN -> 0x7FC0), as int32."""
        u = v.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return tl.where(v != v, 0x7FC0, r.to(tl.int32))

    @triton.jit
    def from_bits(r):
        """bfloat16 bits (int32, 0..0xFFFF) -> its float32 value."""
        return (r.to(tl.uint32) << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def store_bits(ptr, r, mask):
        tl.store(ptr, (r - ((r >> 15) << 16)).to(tl.int16), mask=mask)     # 0..0xFFFF as int16's bits

    if os.environ.get("TRITON_INTERPRET") == "1":
        @triton.jit
        def rsqrt(v):
            """The interpreter's: 1 / sqrt, each correctly rounded, as PyTorch's CPU rsqrt computes it."""
            return tl.math.rsqrt(v)
    else:
        @triton.jit
        def rsqrt(v):
            """libdevice's rsqrtf: what the stock's CUDA kernel (``::rsqrt`` on a float) compiles to."""
            return libdevice.rsqrt(v)

    @triton.jit
    def normed(x, w, r):
        """The norm's output value as the stock rounds it: bf16(w * bf16(x * r)), as float32."""
        return _from_bits(_bf16_bits(w * _from_bits(_bf16_bits(x * r))))

    @triton.jit
    def turned_bits(y, partner, ti, cos_ptr, sin_ptr, HD: tl.constexpr):
        """RoPE of one row at position ``ti``: bf16(bf16(y * cos) + bf16(turned * sin)), ``turned`` the partners
        (``-partner`` in the first half), as bfloat16 bits."""
        i = tl.arange(0, HD)
        turned = tl.where(i < HD // 2, -partner, partner)
        c = tl.load(cos_ptr + ti * HD + i).to(tl.float32)
        s = tl.load(sin_ptr + ti * HD + i).to(tl.float32)
        return _bf16_bits(_from_bits(_bf16_bits(y * c)) + _from_bits(_bf16_bits(turned * s)))

    _bf16_bits, _from_bits, _store_bits, _rsqrt = bf16_bits, from_bits, store_bits, rsqrt
    _turned_bits, _normed = turned_bits, normed

    # nothing specialized on its value (a pointer's alignment, an int that is 1): one compiled variant per width,
    # made by the start-up check, so no capture ever compiles
    @triton.jit(do_not_specialize=["x_ptr", "out_ptr", "d"])
    def squares(x_ptr, out_ptr, d, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK)
        m = i < d
        x = tl.load(x_ptr + row * d + i, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * d + i, x * x, mask=m)

    @triton.jit(do_not_specialize=["x_ptr", "var_ptr", "w_ptr", "out_ptr", "d", "eps"])
    def norm_tail(x_ptr, var_ptr, w_ptr, out_ptr, d, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK)
        m = i < d
        x = tl.load(x_ptr + row * d + i, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + i, mask=m, other=0.0).to(tl.float32)
        r = _rsqrt(tl.load(var_ptr + row) + eps)
        _store_bits(out_ptr + row * d + i, _bf16_bits(_normed(x, w, r)), m)     # exact: already a bfloat16

    @triton.jit(do_not_specialize=["x_ptr", "cos_ptr", "sin_ptr", "out_ptr", "h", "t", "sx0", "sx1", "sx2", "so0",
                                   "so1", "so2"])
    def rope(x_ptr, cos_ptr, sin_ptr, out_ptr, h, t, sx0, sx1, sx2, so0, so1, so2, HD: tl.constexpr):
        p = tl.program_id(0).to(tl.int64)
        ti = p % t
        hi = (p // t) % h
        bi = p // (t * h)
        i = tl.arange(0, HD)
        half: tl.constexpr = HD // 2
        j = (i + half) % HD                                               # the partner of i in the turn
        xrow = x_ptr + bi * sx0 + hi * sx1 + ti * sx2
        x = tl.load(xrow + i).to(tl.float32)
        partner = tl.load(xrow + j).to(tl.float32)
        _store_bits(out_ptr + bi * so0 + hi * so1 + ti * so2 + i, _turned_bits(x, partner, ti, cos_ptr, sin_ptr, HD),
                    i < HD)

    @triton.jit(do_not_specialize=["x_ptr", "var_ptr", "w_ptr", "cos_ptr", "sin_ptr", "out_ptr", "h", "t", "eps",
                                   "so0", "so1", "so2"])
    def norm_rope(x_ptr, var_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, h, t, eps, so0, so1, so2, HD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)          # x [B, T, H, hd] contiguous: row = (b * T + ti) * H + hi
        hi = row % h
        ti = (row // h) % t
        bi = row // (h * t)
        i = tl.arange(0, HD)
        half: tl.constexpr = HD // 2
        j = (i + half) % HD
        r = _rsqrt(tl.load(var_ptr + row) + eps)
        xi = tl.load(x_ptr + row * HD + i).to(tl.float32)
        xj = tl.load(x_ptr + row * HD + j).to(tl.float32)
        wi = tl.load(w_ptr + i).to(tl.float32)
        wj = tl.load(w_ptr + j).to(tl.float32)
        _store_bits(out_ptr + bi * so0 + hi * so1 + ti * so2 + i,
                    _turned_bits(_normed(xi, wi, r), _normed(xj, wj, r), ti, cos_ptr, sin_ptr, HD), i < HD)

    return SimpleNamespace(squares=squares, norm_tail=norm_tail, rope=rope, norm_rope=norm_rope)


@functools.lru_cache(maxsize=1)
def _kernels() -> SimpleNamespace:
    return _define()


def available() -> str:
    """"" when Triton can be imported here, else why not (one line)."""
    try:
        _kernels()
    except Exception as e:  # noqa: BLE001 - missing, or too old for libdevice: the stock chains run
        return f"Triton unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    return ""
