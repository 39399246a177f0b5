"""Where the exact fused kernels of :mod:`.norm_rope` run: inside CUDA graph captures, on a device whose
start-up check proved them.

A model's RMSNorm and RoPE ask :func:`use_fused` on every call. It answers yes only when

* the tensor is on a CUDA device for which :func:`prepare` ran the check and the check chose the kernels, and
* the calling thread's stream is being captured (a graph's kernels are launched once and replayed for the
  session's life: that is where fewer kernels pay; eager steps, the stock-like mode's included, keep the
  stock chains, so the two modes of the optimizations toggle are compared kernel for kernel elsewhere).

:func:`prepare` is one :func:`engine.fastpath.self_check` ("exact fused RMSNorm/RoPE"): the stock chains and
the fused kernels, each captured into a CUDA graph and replayed, over fresh random bfloat16 inputs at the
model's shapes (every norm width and head layout, one and several positions) with row scales from 1e-3 to
1e3, plus a 65,536-row sweep of the reciprocal square root; chosen only when every output is ``torch.equal``
and laid out as the stock's. The verdict is cached per device, libraries and code like every fast path's, and
``DUPLEXCADENCE_REFERENCE_PATHS=1`` keeps the stock chains without checking.
"""
from __future__ import annotations

import dataclasses
import os
import threading
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

import torch

from engine import fastpath

from . import norm_rope

PATH = "exact fused RMSNorm/RoPE"
_lock = threading.Lock()
_chosen: Dict[int, bool] = {}          # CUDA device index -> the check chose the fused kernels there


def use_fused(x: torch.Tensor) -> bool:
    """Whether ``x``'s norm or RoPE runs the fused kernels now (the hot path: a dict lookup first)."""
    return bool(_chosen) and x.is_cuda and _chosen.get(x.device.index, False) \
        and torch.cuda.is_current_stream_capturing()


def prepare(device, config: object, norm_shapes: Sequence[Tuple[Tuple[int, ...], float]],
            rope_shapes: Sequence[Tuple[int, int, int]], stock_norm: Callable, stock_rope: Callable,
            norm_rope_shapes: Sequence[Tuple[Tuple[int, ...], float]] = ()) -> fastpath.Verdict:
    """Check the fused kernels against the stock chains on ``device`` (before anything is captured).

    ``norm_shapes``: ``(x shape, eps)`` of each RMSNorm the model captures (the last dim its width);
    ``rope_shapes``: ``(heads, positions, head_dim)`` of each RoPE; ``stock_norm(x, weight, eps)`` and
    ``stock_rope(x, cos, sin)``: the model's stock chains; ``norm_rope_shapes``: ``(x shape [1, T, H, hd], eps)`` of
    each per-head norm followed by RoPE (Qwen3's q and k). ``config``: what names the model for the cache."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return fastpath.Verdict(PATH, False, "not applicable: a CPU captures no graphs", scope=fastpath.CAPTURED_ONLY)
    missing = norm_rope.available()
    made: List[Dict[str, List]] = []                # the inputs, made once by the first trial (none when cached)

    def trial(on: bool):
        if not made:
            made.append(_inputs(dev, norm_shapes, rope_shapes, norm_rope_shapes))
        run = _fused_run if on else _stock_run(stock_norm, stock_rope)
        return _with_layouts(fastpath.replayed(lambda: run(made[0]), dev))

    key = (config, tuple(norm_shapes), tuple(rope_shapes), tuple(norm_rope_shapes))
    v = fastpath.self_check(PATH, dev, key, trial, not_applicable=missing or None)
    if not v.chosen:                                 # the stock chains stay (nothing else on this device chose)
        return v
    with _lock:
        _chosen[dev.index if dev.index is not None else torch.cuda.current_device()] = True
    return dataclasses.replace(v, scope=fastpath.CAPTURED_ONLY)


def forget() -> None:
    """Back to the stock chains everywhere (tests)."""
    with _lock:
        _chosen.clear()


# -- the trial ---------------------------------------------------------------------------------------------
_SWEEP = (65536, 128)          # rows x width of the extra norm whose rows span the rsqrt's inputs


def _inputs(dev, norm_shapes, rope_shapes, norm_rope_shapes) -> Dict[str, List]:
    """Fresh random bfloat16 inputs (a private CPU generator, then copied: no session's generator moves)."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))

    def rand(*shape, scale_rows: bool = False) -> torch.Tensor:
        x = torch.randn(*shape, generator=g)
        if scale_rows:                                       # every row its own magnitude, 1e-3 .. 1e3
            x = x * torch.pow(10.0, torch.empty(*shape[:-1], 1).uniform_(-3, 3, generator=g))
        return x.to(torch.bfloat16).to(dev)

    norms = [(rand(*shape, scale_rows=True), rand(shape[-1]), eps) for shape, eps in norm_shapes]
    norms.append((rand(*_SWEEP, scale_rows=True), rand(_SWEEP[1]), norm_shapes[0][1] if norm_shapes else 1e-6))
    ropes = []
    for h, t, hd in rope_shapes:
        x = rand(1, t, h, hd, scale_rows=True).transpose(1, 2)     # [1, H, T, hd]: the projections' view
        ropes.append((x, rand(t, hd), rand(t, hd)))
    both = []
    for shape, eps in norm_rope_shapes:                        # [1, T, H, hd]: a projection's heads
        both.append((rand(*shape, scale_rows=True), rand(shape[-1]), eps, rand(shape[1], shape[3]),
                     rand(shape[1], shape[3])))
    return {"norms": norms, "ropes": ropes, "both": both}


def _stock_run(stock_norm: Callable, stock_rope: Callable) -> Callable:
    def run(inputs):
        return ([stock_norm(x, w, eps) for x, w, eps in inputs["norms"]] +
                [stock_rope(x, c, s) for x, c, s in inputs["ropes"]] +
                [stock_rope(stock_norm(x, w, eps).transpose(1, 2), c, s) for x, w, eps, c, s in inputs["both"]])
    return run


def _fused_run(inputs):
    return ([norm_rope.rms_norm(x, w, eps) for x, w, eps in inputs["norms"]] +
            [norm_rope.rope(x, c, s) for x, c, s in inputs["ropes"]] +
            [norm_rope.rms_norm_rope(x, w, eps, c, s) for x, w, eps, c, s in inputs["both"]])


def _with_layouts(outs: Iterable[torch.Tensor]) -> List[torch.Tensor]:
    """The (cloned, layout-keeping) outputs, each followed by its strides over its dims longer than one (a CPU
    tensor: the comparison covers the layout too)."""
    res = []
    for o in outs:
        res += [o, torch.tensor([s for s, n in zip(o.stride(), o.shape) if n > 1])]
    return res
