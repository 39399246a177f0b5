"""Streaming blocks of the codec decoder, each declaring its own state under a prefix (reusable).

A step holds a whole second of frames in *frame-major* layout ``[n, C, t]``: frame ``f``'s ``[C, t]``
columns are one contiguous block. What the stock computes with a library call whose kernel depends on
the shape (convolutions, reductions over channels, the FFT, MKL's vector math) runs once per frame on
that frame's block, at the stock's shape, strides and 64-byte alignment (:func:`frame_blocks`: MKL's
AVX-512 kernels round by layout and alignment; ``tests/test_op_signatures.py`` compares every such call
with nemo's); what is computed
element by element runs once per second over all frames, where its bits cannot depend on how many
elements there are (CUDA). On the CPU a transcendental function (exp, erf, cos, rsqrt) may take a
vectorized or a scalar path depending on an element's place in the tensor, so there
``pointwise_per_frame`` applies those per frame too. ``batched`` (an experiment, measured by the
benchmark) names the kinds of library call (:data:`BATCHABLE`) made once per second as well.

* :class:`CausalConvNeXt` — depthwise causal conv (k) -> channel LayerNorm -> 1x1 (4C) -> GELU -> 1x1
  -> residual; region ``history``: the last ``k - 1`` input columns, Fixed.
* :class:`StreamingISTFT` — 1x1 conv to log-magnitude | phase -> soft-capped magnitude -> complex
  spectrogram -> inverse real FFT per column -> clamp to the window -> window -> overlap-add ->
  divide by the window envelope; region ``spec``: the last spectrogram columns, Fixed.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.core import Clock, Fixed, Region

LN_EPS = 1e-6
MAG_CAP = 100.0             # the largest magnitude the head can produce
#: library calls that can be made once per second instead of per frame (bit-exact only where the library keeps
#: its per-frame kernel for the whole second's shape: the benchmark checks each kind)
BATCHABLE = frozenset({"convtr", "dwconv", "pwconv", "mean", "head", "fft"})
ALIGN_BYTES = 512           # per-frame library inputs start 512-byte aligned, as fresh CUDA allocations do


def frame_blocks(x: torch.Tensor, strides: Optional[Tuple[int, ...]] = None) -> List[torch.Tensor]:
    """The frames of ``x`` [n, ...] as n tensors [1, ...], each starting 512-byte aligned as a fresh allocation.

    ``strides``: each frame's strides (a dense layout of a [1, ...] tensor, e.g. the stock's transposed
    latent or channels-last conv output); None: contiguous. The library's kernel (MKL's vectorized math,
    GEMM and FFT paths on the CPU, cuDNN's algorithm on the GPU) may depend on both the layout and the
    alignment, so a frame is handed to it exactly as the stock's per-frame call holds it."""
    n, per = x.shape[0], x[0].numel()
    shape = (1,) + tuple(x.shape[1:])
    if strides is not None and tuple(strides) == torch.empty(shape, device="meta").stride():
        strides = None
    if strides is None and (per * x.element_size()) % ALIGN_BYTES == 0 and x.is_contiguous():
        return [x[f:f + 1] for f in range(n)]
    stride = -(-per * x.element_size() // ALIGN_BYTES) * ALIGN_BYTES // x.element_size()
    buf = torch.empty((n, stride), dtype=x.dtype, device=x.device)
    if strides is None:
        buf[:, :per].copy_(x.reshape(n, per))
        return [buf[f, :per].view(shape) for f in range(n)]
    blocks = [buf[f].as_strided(shape, strides) for f in range(n)]
    for f, b in enumerate(blocks):
        b.copy_(x[f:f + 1])
    return blocks


def per_frame(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batched: bool = False,
              strides: Optional[Tuple[int, ...]] = None) -> torch.Tensor:
    """``fn`` applied to each frame of ``x`` [n, ...] at the stock's per-frame shape (and ``strides``, see
    :func:`frame_blocks`), results stacked."""
    if batched:
        return fn(x)
    outs = [fn(b) for b in frame_blocks(x, strides)]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def pointwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, frames: bool) -> torch.Tensor:
    """An elementwise function over the second, or frame by frame (CPU transcendental functions: MKL's
    vector math takes a vectorized or a scalar path by an element's place and the array's alignment, so
    each frame is handed over aligned as the stock's fresh per-frame tensor; ``fn`` may slice it first)."""
    if not frames:
        return fn(x)
    outs = [fn(b) for b in frame_blocks(x)]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def with_history(x: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """x [n, C, t] -> [n, C, h + t]: each frame preceded by the h columns before it in the stream.

    ``history`` [1, C, h] holds the h columns before this second; it is updated in place to the last
    h columns of the second (the causal conv's cache, replaced every step)."""
    n, c, t = x.shape
    h = history.shape[-1]
    stream = torch.cat([history[0], x.transpose(0, 1).reshape(c, n * t)], dim=-1)       # [C, h + n*t]
    windows = stream.unfold(-1, h + t, t).transpose(0, 1).contiguous()                 # [n, C, h + t]
    history[0].copy_(stream[:, n * t:])
    return windows


class CausalConvNeXt(nn.Module):
    """One causal ConvNeXt block of the decoder (channels ``dim``, depthwise kernel ``kernel``)."""

    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.dim, self.kernel = dim, kernel
        z = lambda *s: nn.Parameter(torch.zeros(*s), requires_grad=False)   # noqa: E731
        self.dw_w, self.dw_b = z(dim, 1, kernel), z(dim)
        self.norm_w, self.norm_b = z(dim), z(dim)
        self.pw1_w, self.pw1_b = z(4 * dim, dim, 1), z(4 * dim)
        self.pw2_w, self.pw2_b = z(dim, 4 * dim, 1), z(dim)

    def regions(self, clock: Clock) -> List[Region]:
        return [Region("history", (1, self.dim, None), clock, Fixed(self.kernel - 1),
                       stock_note="CausalConv1dCache: torch.cat + slice each call",
                       doc="the depthwise conv's last k-1 input columns")]

    def second(self, x: torch.Tensor, state: Mapping, frames: bool, batched: frozenset = frozenset()) -> torch.Tensor:
        """x [n, C, t] -> [n, C, t] over the block's state (``state["history"]``)."""
        padded = with_history(x, state["history"].get())                                # [n, C, k-1+t]
        dw = per_frame(lambda b: F.conv1d(b, self.dw_w, self.dw_b, groups=self.dim), padded, "dwconv" in batched)
        mean = per_frame(lambda b: b.mean(1, keepdim=True), dw, "mean" in batched)       # [n, 1, t]
        centered = dw - mean
        var = per_frame(lambda b: b.mean(1, keepdim=True), centered.square(), "mean" in batched)   # [n, 1, t]
        rstd = pointwise(lambda v: torch.rsqrt(v + LN_EPS), var, frames)
        y = centered * rstd * self.norm_w[:, None] + self.norm_b[:, None]                # [n, C, t]
        h = per_frame(lambda b: F.conv1d(b, self.pw1_w, self.pw1_b), y, "pwconv" in batched)   # [n, 4C, t]
        h = pointwise(F.gelu, h, frames)
        return x + per_frame(lambda b: F.conv1d(b, self.pw2_w, self.pw2_b), h, "pwconv" in batched)


class StreamingISTFT(nn.Module):
    """The decoder's head: columns [n, C, T] -> samples [n, hop * T], streaming over ``spec``."""

    def __init__(self, dim: int, n_fft: int, hop: int, history: int, trim: int):
        super().__init__()
        self.n_fft, self.hop, self.history, self.trim = n_fft, hop, history, trim
        self.bins = n_fft // 2 + 1
        self.pad = (n_fft - hop) // 2
        self.proj = nn.Parameter(torch.zeros(2 * self.bins, dim, 1), requires_grad=False)
        self._tables: Dict[Tuple[str, int], Tuple[torch.Tensor, torch.Tensor]] = {}

    def regions(self, clock: Clock) -> List[Region]:
        return [Region("spec", (1, 2 * self.bins, None), clock, Fixed(self.history),
                       stock_note="CausalConv1dCache: torch.cat + slice each call (complex)",
                       doc="real | imaginary parts of the last spectrogram columns")]

    def tables(self, device: torch.device, columns: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Window [n_fft, 1] and the envelope of one call's kept samples, computed once per device the
        way the stock computes them on every call (so their bits are the device's own)."""
        key = (str(device), columns)
        if key not in self._tables:
            win = torch.hann_window(self.n_fft, device=device)
            cols = self.history + columns
            out = (cols - 1) * self.hop + self.n_fft
            env = F.fold(win.square().expand(cols, -1).transpose(0, 1), output_size=(1, out),
                         kernel_size=(1, self.n_fft), stride=(1, self.hop)).reshape(-1)[self.pad:out - self.pad]
            if not bool((env > 1e-11).all()):
                raise ValueError("the iSTFT window envelope has zeros: n_fft / hop_length cannot overlap-add")
            self._tables[key] = (win[:, None], env[self.trim:env.numel() - self.trim].clone())
        return self._tables[key]

    def second(self, x: torch.Tensor, state: Mapping, frames: bool, batched: frozenset = frozenset()) -> torch.Tensor:
        n, _, cols = x.shape
        win, env = self.tables(x.device, cols)
        y = per_frame(lambda b: F.conv1d(b, self.proj), x, "head" in batched)           # [n, 2B, T]
        # log-magnitude | phase: views of each frame's head output, at the stock's offsets in it
        b = self.bins
        mag = pointwise(lambda m: torch.exp(F.softplus(math.log(MAG_CAP) - m[:, :b]).neg()) * MAG_CAP, y, frames)
        cos = pointwise(lambda p: torch.cos(p[:, b:]), y, frames)
        sin = pointwise(lambda p: torch.sin(p[:, b + 1:-1]), y, frames)                  # DC, Nyquist: real
        parts = torch.zeros((n, 2 * self.bins, cols), dtype=x.dtype, device=x.device)   # [n, re | im, T]
        torch.mul(mag, cos, out=parts[:, :self.bins])
        torch.mul(mag[:, 1:-1], sin, out=parts[:, self.bins + 1:2 * self.bins - 1])
        padded = with_history(parts, state["spec"].get())                               # [n, 2B, h + T]
        spec = torch.complex(padded[:, :self.bins], padded[:, self.bins:])               # [n, B, h + T]
        cols_in = self.history + cols
        frames_t = per_frame(lambda s: torch.fft.irfft(s, n=self.n_fft, dim=-2), spec, "fft" in batched)  # [n, N, h+T]
        frames_t = frames_t.clamp(-win, win) * win
        out = (cols_in - 1) * self.hop + self.n_fft
        wav = F.fold(frames_t, output_size=(1, out), kernel_size=(1, self.n_fft), stride=(1, self.hop))
        lo = self.pad + self.trim
        return wav.reshape(n, out)[:, lo:out - lo] / env                                 # [n, hop * T]
