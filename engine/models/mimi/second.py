"""Layer-major decode of a whole second (CUDA): the same arithmetic as frame by frame, fewer kernels.

Frame by frame, each frame runs every layer before the next frame starts. Here each layer runs over
the whole second before the next layer, which the data flow allows: a layer's state (ring KV cache,
conv history, transposed-conv overlap) depends only on that layer's own inputs. What can then run
once per second is exactly what is computed element by element or row by row, whose bits on CUDA
do not depend on how many rows there are: layer norms, RoPE, GELU/ELU, layer scale, residual adds,
the overlap-add of transposed convs, the attention mask. What moshi computes as a matrix product or
a convolution of one frame (cuBLAS / cuDNN pick kernels by shape) still runs per frame at moshi's
shapes, writing into slices of the second's buffers (``torch.mm(out=)``), and attention runs per
frame over the ring, unless ``batch_matmul`` / ``batch_matmul_strided`` / ``batch_conv`` /
``batch_conv_tr`` / ``batch_attention`` ask for one call per second (bit-exact only where the
library keeps the same arithmetic for both shapes: the start-up self-check decides, ``fastpaths.py``).

On CPU the frame-by-frame path is used: there, whether an element of a transcendental op (exp,
erf, cos) takes the vectorized or the scalar path depends on the tensor's layout.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch
import torch.nn.functional as F

from .modules import MimiTransformer, SecondTables, SEANetDecoder


def linear_rows(x: torch.Tensor, weight: torch.Tensor, n: int, batch: bool, strided: bool = False) -> torch.Tensor:
    """x [1, M, K] contiguous -> [1, M, N]; per frame: ``n`` row blocks, each moshi's [rows, K] @ W^T.

    ``batch``: one GEMM of all M rows; ``strided``: one strided-batched GEMM whose batch is the
    ``n`` frames (each item moshi's shape, the weight shared with batch stride 0).
    """
    if batch:
        return F.linear(x, weight)
    m, k = x.shape[1], x.shape[2]
    if strided:
        out = torch.bmm(x.view(n, m // n, k), weight.t().expand(n, k, weight.shape[0]))   # [n, rows, N]
        return out.view(1, m, weight.shape[0])
    out = torch.empty((1, m, weight.shape[0]), dtype=x.dtype, device=x.device)
    x2, o2, rows = x.view(m, k), out.view(m, weight.shape[0]), m // n
    for f in range(n):
        torch.mm(x2[f * rows:(f + 1) * rows], weight.t(), out=o2[f * rows:(f + 1) * rows])
    return out


def ring_written(slots: torch.Tensor, capacity: int) -> torch.Tensor:
    """[n, T] ring slots of a second's new steps -> [n, cap] bool: slot s holds a step of frame <= f."""
    ring = torch.arange(capacity, device=slots.device)
    return (slots.unsqueeze(-1) == ring).any(1).cumsum(0) > 0                    # [n, cap]


def attention_frames(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, tab: SecondTables
                     ) -> torch.Tensor:
    """Frame by frame, as moshi: write frame f's keys/values into the ring, attend over the ring.

    q, k, v [n, H, T, Dh] (items may be strided views); cache [2, 1, H, cap, Dh] -> [n, H, T, Dh].
    """
    att = []
    for f in range(q.shape[0]):
        cache[0].index_copy_(2, tab.slots[f], k[f:f + 1])
        cache[1].index_copy_(2, tab.slots[f], v[f:f + 1])
        att.append(F.scaled_dot_product_attention(q[f:f + 1], cache[0], cache[1], tab.mask[f:f + 1, None],
                                                  dropout_p=0.0))                 # [1, H, T, Dh]
    return torch.cat(att)


def attention_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, tab: SecondTables,
                      written: torch.Tensor) -> torch.Tensor:
    """The same attention as :func:`attention_frames` in one call whose batch is the frames.

    Frame f attends over the ring as it stood after frame f's write: the slots written by frames <= f
    (``written[f]``) hold the new keys/values, the others still the old ones, which later frames of
    the second overwrite. So every frame's ring is rebuilt from the ring before and after the second
    (a copy, one write of all new steps, one select); the ring's layout, each frame's keys and mask
    are exactly the per-frame call's. Needs a ring of at least the second's steps (no slot written twice).
    """
    n, h, t, dh = q.shape
    old = cache.clone()                                                           # [2, 1, H, cap, Dh]
    slots = tab.slots.reshape(-1)                                                 # [n*T]
    cache[0].index_copy_(2, slots, k.transpose(0, 1).reshape(1, h, n * t, dh))
    cache[1].index_copy_(2, slots, v.transpose(0, 1).reshape(1, h, n * t, dh))
    kv = torch.where(written.view(1, n, 1, -1, 1), cache, old)                    # [2, n, H, cap, Dh]
    return F.scaled_dot_product_attention(q, kv[0], kv[1], tab.mask[:, None], dropout_p=0.0)   # [n, H, T, Dh]


def transformer_second(tr: MimiTransformer, x: torch.Tensor, caches: List[torch.Tensor], tab: SecondTables,
                       batch_matmul: bool, strided: bool = False, batch_attention: bool = False) -> torch.Tensor:
    """x [1, n*T, D] -> [1, n*T, D]: every layer over the whole second, attention frame by frame
    (``batch_attention``: all frames in one call, see :func:`attention_batched`)."""
    cfg = tr.cfg
    n, t = tab.mask.shape[0], cfg.upsample_stride
    h, dh, d = cfg.num_heads, cfg.head_dim, cfg.dimension
    rot = torch.stack([torch.cos(tab.angles), torch.sin(tab.angles)], dim=-1)   # [n, 1, 1, T, Dh/2, 2]
    rot = rot.view(n, 1, 1, 1, t, dh // 2, 1, 2)
    if batch_attention and n * t > cfg.context:
        raise ValueError(f"batched attention needs a ring of at least {n * t} steps, this one has {cfg.context}")
    written = ring_written(tab.slots, cfg.context) if batch_attention else None
    for layer, cache in zip(tr.layers, caches):
        y = F.layer_norm(x, (d,), layer.norm1_w, layer.norm1_b, 1e-5)
        proj = linear_rows(y, layer.in_proj, n, batch_matmul, strided)             # [1, n*T, 3D]
        qk = proj.view(1, n, t, 3, h, dh // 2, 2)[:, :, :, :2].permute(1, 3, 0, 4, 2, 5, 6)  # [n, 2, 1, H, T, Dh/2, 2]
        prod = qk.unsqueeze(-1) * rot                                              # [..., re|im, cos|sin]
        rq = torch.empty((n, 2, 1, h, t, dh // 2, 2), dtype=x.dtype, device=x.device)
        torch.sub(prod[..., 0, 0], prod[..., 1, 1], out=rq[..., 0])
        torch.add(prod[..., 0, 1], prod[..., 1, 0], out=rq[..., 1])
        qk = rq.view(n, 2, h, t, dh)                                               # frame f: q, k [H, T, Dh]
        v = proj.view(n, t, 3, h, dh)[:, :, 2].transpose(1, 2)                     # [n, H, T, Dh]
        if written is not None:
            att = attention_batched(qk[:, 0], qk[:, 1], v, cache, tab, written)
        else:
            att = attention_frames(qk[:, 0], qk[:, 1], v, cache, tab)              # [n, H, T, Dh]
        a = att.transpose(1, 2).reshape(1, n * t, d)                               # [1, n*T, D]
        x = x + layer.scale1 * linear_rows(a, layer.out_proj, n, batch_matmul, strided)
        y = F.layer_norm(x, (d,), layer.norm2_w, layer.norm2_b, 1e-5)
        hid = F.gelu(linear_rows(y, layer.linear1, n, batch_matmul, strided))     # [1, n*T, FF]
        u = linear_rows(hid, layer.linear2, n, batch_matmul, strided)
        x = x + layer.scale2 * u
    return x


def conv_second(x: torch.Tensor, prev: Optional[torch.Tensor], weight, bias, n: int, batch: bool,
                dilation: int = 1) -> torch.Tensor:
    """Causal conv over a second x [1, C, n*L] with history ``prev`` [1, C, TP] (updated in place)."""
    xc = x if prev is None else torch.cat([prev, x], dim=-1)                       # [1, C, TP + n*L]
    tp = 0 if prev is None else prev.shape[-1]
    if batch:
        y = F.conv1d(xc, weight, bias, dilation=dilation)
    else:
        ln = x.shape[-1] // n
        y = torch.cat([F.conv1d(xc[..., f * ln:f * ln + tp + ln].contiguous(), weight, bias, dilation=dilation)
                       for f in range(n)], dim=-1)
    if prev is not None:
        prev.copy_(xc[..., xc.shape[-1] - tp:])
    return y


def conv_tr_second(x: torch.Tensor, partial: torch.Tensor, weight, bias, stride: int, n: int, batch: bool = False,
                   groups: int = 1) -> torch.Tensor:
    """Transposed conv per frame, overlap-add of all frames at once: x [1, Cin, n*L] -> [1, Cout, n*L*stride].

    ``batch``: the frames as one call's batch [n, Cin, L] instead of n calls of [1, Cin, L] (exact only
    where the library computes each batch item as it computes a single one). The overlap (without
    bias) of frame f waits in ``carry[f + 1]``, the last frame's in ``partial`` (updated in place).
    """
    ln, pt = x.shape[-1] // n, partial.shape[-1]
    if batch:
        xs = x.view(x.shape[1], n, ln).transpose(0, 1).contiguous()                # [n, Cin, L]
        ys = F.conv_transpose1d(xs, weight, bias, stride=stride, groups=groups)    # [n, Cout, L*stride + PT]
        ys = ys.unsqueeze(1)                                                       # [n, 1, Cout, L*stride + PT]
    else:
        ys = torch.stack([F.conv_transpose1d(x[..., f * ln:(f + 1) * ln].contiguous(), weight, bias, stride=stride,
                                             groups=groups) for f in range(n)])    # [n, 1, Cout, L*stride + PT]
    body = ys.shape[-1] - pt
    carry = torch.empty((n,) + tuple(partial.shape), dtype=x.dtype, device=x.device)   # frame f's incoming overlap
    carry[0].copy_(partial)
    if bias is None:
        carry[1:].copy_(ys[:-1, ..., body:])
        ys[..., :pt] += carry
        partial.copy_(ys[-1, ..., body:])
    else:
        torch.sub(ys[:-1, ..., body:], bias[:, None], out=carry[1:])
        ys[..., :pt] += carry
        torch.sub(ys[-1, ..., body:], bias[:, None], out=partial)
    return ys[..., :body].permute(1, 2, 0, 3).reshape(1, ys.shape[2], n * body)


def seanet_second(dec: SEANetDecoder, x: torch.Tensor, region: Callable[[str], Optional[torch.Tensor]], n: int,
                  batch_conv: bool, batch_conv_tr: bool = False) -> torch.Tensor:
    """x [1, D, n*T] -> [1, 1, n*frame_size], layer by layer over the second."""
    y = conv_second(x, region("conv_in"), dec.w_in, dec.b_in, n, batch_conv)
    for s, stage in enumerate(dec.stages):
        y = conv_tr_second(F.elu(y), region(f"stage{s}.partial"), stage.w, stage.b, stage.ratio, n, batch_conv_tr)
        for j, res in enumerate(stage.res):
            h = conv_second(F.elu(y), region(f"stage{s}.res{j}"), res.w1, res.b1, n, batch_conv, res.dilation)
            y = y + conv_second(F.elu(h), None, res.w2, res.b2, n, batch_conv)
    return conv_second(F.elu(y), region("conv_out"), dec.w_out, dec.b_out, n, batch_conv)
