"""Mimi decoder building blocks, frame by frame, reading and writing state through region handles.

Each block computes exactly what moshi's streaming modules compute for one 12.5 Hz frame, with
the same tensor shapes and memory layouts at every elementwise transcendental (cos, sin, exp,
ELU, GELU), so the bits match moshi on CPU and GPU. What moshi recomputes inside every layer but
depends only on the frame's position (RoPE angles, the ring's slot indices and attention mask)
is computed once per second (integer and exactly-rounded float ops) or once per frame (cos/sin),
and shared by all layers. State lives in the engine's arena; blocks mutate it in place
(``copy_``, ``index_copy_``, ``out=``), so one CUDA graph per second replays over it.

The transformer and the SEANet decoder are streaming blocks: each declares its own regions under short
names (``kv{i}``; ``conv_in``, ``stage{s}.partial``, ``stage{s}.res{j}``, ``conv_out``) on the clocks
its holder gives it, and reads them by those names; the holder mounts them under a prefix.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.core import Clock, Fixed, Region, Ring

from .config import MimiConfig

CONV_NOTE = "StreamingConv1d `previous`, fixed buffer at stream start"
CONV_TR_NOTE = "StreamingConvTranspose1d `partial`, fixed buffer at stream start"


def _param(shape) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape), requires_grad=False)


# -- streaming convolutions ------------------------------------------------------------------------
def causal_conv(x: torch.Tensor, prev: Optional[torch.Tensor], weight, bias, dilation: int = 1) -> torch.Tensor:
    """Causal conv with its last ``(k-1)*dilation`` input samples kept in ``prev`` (updated in place).

    x: [1, C_in, T] -> [1, C_out, T]; prev: [1, C_in, TP] state view (None when TP == 0).
    """
    if prev is None:
        return F.conv1d(x, weight, bias, dilation=dilation)
    xc = torch.cat([prev, x], dim=-1)                       # [1, C_in, TP + T]
    y = F.conv1d(xc, weight, bias, dilation=dilation)
    prev.copy_(xc[..., xc.shape[-1] - prev.shape[-1]:])
    return y


def causal_conv_tr(x: torch.Tensor, partial: torch.Tensor, weight, bias, stride: int, groups: int = 1) -> torch.Tensor:
    """Transposed conv whose overlapping tail (without bias) waits in ``partial`` for the next frame.

    x: [1, C_in, T] -> [1, C_out, T*stride]; partial: [1, C_out, K - stride] state view.
    """
    y = F.conv_transpose1d(x, weight, bias, stride=stride, groups=groups)   # [1, C_out, T*stride + PT]
    pt = partial.shape[-1]
    y[..., :pt] += partial
    tail = y[..., y.shape[-1] - pt:]
    if bias is None:
        partial.copy_(tail)
    else:
        torch.sub(tail, bias[:, None], out=partial)
    return y[..., : y.shape[-1] - pt]


# -- split RVQ ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def part_strides(books: int, dim: int) -> Tuple[int, ...]:
    """Strides of moshi's one-frame latent part: a 0-d zero plus ``books`` codebook vectors [1, 1, dim], each
    transposed to [1, dim, 1]. TensorIterator's layout rules decide them (one vector keeps the transposed
    strides, two or more give contiguous ones), so the same additions run on the meta device to find them."""
    vec = torch.empty(1, 1, dim, device="meta").transpose(1, 2)
    acc = torch.zeros((), device="meta")
    for _ in range(books):
        acc = acc + vec
    return tuple(acc.stride())


class SplitRVQ(nn.Module):
    """Codes -> latent: sum of codebook vectors (semantic, then acoustic), each part projected 1x1."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        self.n_sem = cfg.n_q_semantic
        self.register_buffer("codebooks", torch.zeros(cfg.n_q, cfg.bins, cfg.codebook_dim))
        self.proj_first = _param((cfg.dimension, cfg.codebook_dim, 1))
        self.proj_rest = _param((cfg.dimension, cfg.codebook_dim, 1))
        self.register_buffer("zero", torch.zeros(()))
        # every part's layout found now, at build: the first meta-device call imports torch's meta kernels
        # (~2 s on a CPU host), which a stream's first second must not pay (its deadline is 1 s)
        for books in range(1, cfg.n_q + 1):
            part_strides(books, cfg.codebook_dim)

    def latents(self, codes: torch.Tensor) -> List[Tuple[torch.Tensor, int]]:
        """codes [K, n] -> per part ([1, n, dim], its codebook count): ((0 + e0) + e1) + ... in moshi's
        order (exact per element)."""
        parts = [(0, self.n_sem), (self.n_sem, codes.shape[0])]
        out = []
        for lo, hi in parts:
            if hi <= lo:
                continue
            acc = self.zero
            for j in range(lo, hi):
                acc = acc + F.embedding(codes[j].view(1, -1), self.codebooks[j])   # [1, n, dim]
            out.append((acc, hi - lo))
        return out

    def frame(self, lat: List[Tuple[torch.Tensor, int]], f: int) -> torch.Tensor:
        """Latent of frame ``f``: [1, D, 1] (moshi decodes one frame, T = 1). Each part's projection takes a
        fresh [1, dim, 1] tensor in the layout moshi's one-frame part has (:func:`part_strides`): the
        library's choice of conv kernel follows the input's layout."""
        y = None
        for (acc, books), w in zip(lat, (self.proj_first, self.proj_rest)):
            x = acc[:, f:f + 1].transpose(1, 2)                                      # [1, dim, 1]
            x = torch.empty_strided(x.shape, part_strides(books, x.shape[1]), dtype=x.dtype,
                                    device=x.device).copy_(x)
            if y is None:
                y = F.conv1d(x, w)
            else:
                y += F.conv1d(x, w)
        return y


# -- transformer ----------------------------------------------------------------------------------------
@dataclass
class SecondTables:
    """Per-second position tables shared by every frame and layer."""

    angles: torch.Tensor     # [n, 1, 1, T, Dh/2] float32: RoPE angle freqs * position
    mask: torch.Tensor       # [n, T, capacity] bool: which ring slots each query may attend
    slots: torch.Tensor      # [n, T] int64: ring slot of each new key/value


class MimiLayer(nn.Module):
    """Pre-norm layer: ring-KV self-attention with RoPE, GELU MLP, layer scale on both branches."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        d, ff = cfg.dimension, cfg.dim_feedforward
        self.h, self.dh = cfg.num_heads, cfg.head_dim
        self.norm1_w, self.norm1_b = _param((d,)), _param((d,))
        self.norm2_w, self.norm2_b = _param((d,)), _param((d,))
        self.in_proj, self.out_proj = _param((3 * d, d)), _param((d, d))
        self.linear1, self.linear2 = _param((ff, d)), _param((d, ff))
        self.scale1, self.scale2 = _param((d,)), _param((d,))

    def forward(self, x: torch.Tensor, cache: torch.Tensor, rot: torch.Tensor, mask: torch.Tensor,
                slots: torch.Tensor) -> torch.Tensor:
        # x: [1, T, D]; cache: [2, 1, H, cap, Dh]; rot: [1, 1, T, Dh/2, 2] (cos, sin); mask: [1, 1, T, cap]
        b, t, d = x.shape
        h, dh = self.h, self.dh
        proj = F.linear(F.layer_norm(x, (d,), self.norm1_w, self.norm1_b, 1e-5), self.in_proj)   # [1, T, 3D]
        qk = proj.view(b, t, 3, h, dh // 2, 2)[:, :, :2].permute(2, 0, 3, 1, 4, 5)   # [2, 1, H, T, Dh/2, re|im]
        prod = qk.unsqueeze(-1) * rot.view(1, b, 1, t, dh // 2, 1, 2)               # [..., re|im, cos|sin]
        rq = torch.empty((2, b, h, t, dh // 2, 2), dtype=x.dtype, device=x.device)
        torch.sub(prod[..., 0, 0], prod[..., 1, 1], out=rq[..., 0])   # re*cos - im*sin
        torch.add(prod[..., 0, 1], prod[..., 1, 0], out=rq[..., 1])   # re*sin + im*cos
        q, k = rq.view(2, b, h, t, dh).unbind(0)                       # [1, H, T, Dh] each, contiguous
        v = proj.view(b, t, 3, h, dh)[:, :, 2].transpose(1, 2)         # [1, H, T, Dh]
        cache[0].index_copy_(2, slots, k)
        cache[1].index_copy_(2, slots, v)
        a = F.scaled_dot_product_attention(q, cache[0], cache[1], mask, dropout_p=0.0)   # [1, H, T, Dh]
        a = a.transpose(1, 2).reshape(b, t, d)
        x = x + self.scale1 * F.linear(a, self.out_proj)
        u = F.linear(F.gelu(F.linear(F.layer_norm(x, (d,), self.norm2_w, self.norm2_b, 1e-5), self.linear1)),
                     self.linear2)
        return x + self.scale2 * u


class MimiTransformer(nn.Module):
    """The decoder transformer at 25 Hz, causal over a ring of ``context`` steps."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(MimiLayer(cfg) for _ in range(cfg.num_layers))

    def regions(self, clock: Clock) -> List[Region]:
        """Every layer's keys/values ``kv{i}``: a ring of ``context`` steps of ``clock`` (25 Hz)."""
        cfg = self.cfg
        h, dh, cap = cfg.num_heads, cfg.head_dim, cfg.context
        return [Region(f"kv{i}", (2, 1, h, None, dh), clock, Ring(cap),
                       stock_note=f"RingKVCache (2,1,{h},{cap},{dh}) at stream start",
                       doc=f"layer {i} keys/values, attended as a whole ring with a mask")
                for i in range(cfg.num_layers)]

    def second_tables(self, pos0: torch.Tensor, n: int) -> SecondTables:
        """Tables for ``n`` frames starting at transformer step ``pos0`` (0-d int64 device tensor)."""
        cfg, dev = self.cfg, pos0.device
        t, cap, dh = cfg.upsample_stride, cfg.context, cfg.head_dim
        steps = pos0 + torch.arange(n * t, device=dev)                          # [n*T] absolute steps
        ds = torch.arange(dh // 2, device=dev, dtype=torch.float32)
        freqs = torch.exp(ds * (-math.log(cfg.max_period) * 2 / dh))            # as moshi, on this device
        angles = freqs * steps.to(torch.float32).view(n, 1, 1, t, 1)            # [n, 1, 1, T, Dh/2]
        pos_q = steps.view(n, t, 1)
        last = pos_q[:, t - 1:, :]                                              # [n, 1, 1] newest step
        ring = torch.arange(cap, device=dev)
        pos_k = last - torch.remainder(last - ring, cap)                        # [n, 1, cap]; < 0: empty slot
        delta = pos_q - pos_k                                                   # [n, T, cap]
        mask = (pos_k >= 0) & (delta >= 0) & (delta < cfg.context)
        return SecondTables(angles, mask, torch.remainder(steps, cap).view(n, t))

    def frame(self, x: torch.Tensor, caches: List[torch.Tensor], tables: SecondTables, f: int) -> torch.Tensor:
        """x: [1, D, T] -> [1, D, T] for frame ``f`` of the second."""
        ang = tables.angles[f].clone()                # [1, 1, T, Dh/2], 64-byte aligned as moshi's fresh angles
        rot = torch.stack([torch.cos(ang), torch.sin(ang)], dim=-1)
        mask = tables.mask[f:f + 1, None]                                       # [1, 1, T, cap]
        y = x.transpose(1, 2)
        for layer, cache in zip(self.layers, caches):
            y = layer(y, cache, rot, mask, tables.slots[f])
        return y.transpose(1, 2)


# -- SEANet decoder -------------------------------------------------------------------------------------
class ResBlock(nn.Module):
    """ELU -> causal conv k (dilated) -> ELU -> conv 1, plus the identity skip."""

    def __init__(self, dim: int, hidden: int, kernel: int, dilation: int):
        super().__init__()
        self.dilation = dilation
        self.w1, self.b1 = _param((hidden, dim, kernel)), _param((hidden,))
        self.w2, self.b2 = _param((dim, hidden, 1)), _param((dim,))

    def forward(self, x: torch.Tensor, prev: Optional[torch.Tensor]) -> torch.Tensor:
        h = causal_conv(F.elu(x), prev, self.w1, self.b1, self.dilation)
        return x + F.conv1d(F.elu(h), self.w2, self.b2)


class Stage(nn.Module):
    """ELU -> transposed conv (stride r, kernel 2r) -> residual blocks."""

    def __init__(self, cin: int, cout: int, ratio: int, cfg: MimiConfig):
        super().__init__()
        self.ratio = ratio
        self.w, self.b = _param((cin, cout, 2 * ratio)), _param((cout,))
        self.res = nn.ModuleList(
            ResBlock(cout, cout // cfg.compress, cfg.residual_kernel_size, cfg.dilation_base ** j)
            for j in range(cfg.n_residual_layers))


class SEANetDecoder(nn.Module):
    """Causal SEANet decoder: conv -> stages (x ratios) -> ELU -> conv to one channel."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        self.cfg = cfg
        top = 2 ** len(cfg.ratios) * cfg.n_filters
        self.w_in, self.b_in = _param((top, cfg.dimension, cfg.kernel_size)), _param((top,))
        self.stages = nn.ModuleList(Stage(ci, co, r, cfg) for (ci, co), r in zip(cfg.stage_channels(), cfg.ratios))
        self.w_out, self.b_out = _param((1, cfg.n_filters, cfg.last_kernel_size)), _param((1,))

    def regions(self, clock_in: Clock, stage_clocks: Sequence[Clock]) -> List[Region]:
        """The convs' lookback and the transposed convs' overlap under short names: ``conv_in`` on
        ``clock_in``, stage s's regions and ``conv_out`` on ``stage_clocks[s]`` (convs of kernel 1 keep none)."""
        cfg = self.cfg
        regs = [Region("conv_in", (1, cfg.dimension, None), clock_in, Fixed(cfg.kernel_size - 1),
                       stock_note=CONV_NOTE)]
        for s, ((_, cout), r, clock) in enumerate(zip(cfg.stage_channels(), cfg.ratios, stage_clocks)):
            regs.append(Region(f"stage{s}.partial", (1, cout, None), clock, Fixed(r), stock_note=CONV_TR_NOTE))
            for j in range(cfg.n_residual_layers):
                tp = (cfg.residual_kernel_size - 1) * cfg.dilation_base ** j
                if tp:
                    regs.append(Region(f"stage{s}.res{j}", (1, cout, None), clock, Fixed(tp), stock_note=CONV_NOTE))
        if cfg.last_kernel_size > 1:
            regs.append(Region("conv_out", (1, cfg.n_filters, None), stage_clocks[-1],
                               Fixed(cfg.last_kernel_size - 1), stock_note=CONV_NOTE))
        return regs

    def frame(self, x: torch.Tensor, state) -> torch.Tensor:
        """x: [1, D, T] -> [1, 1, T * hop]; ``state(name)`` gives a region's tensor (or None)."""
        y = causal_conv(x, state("conv_in"), self.w_in, self.b_in)
        for s, stage in enumerate(self.stages):
            y = causal_conv_tr(F.elu(y), state(f"stage{s}.partial"), stage.w, stage.b, stage.ratio)
            for j, res in enumerate(stage.res):
                y = res(y, state(f"stage{s}.res{j}"))
        return causal_conv(F.elu(y), state("conv_out"), self.w_out, self.b_out)
