"""Grouped-query attention of one query without widening the keys and values first, where the device proves it.

The stock's Qwen3 widens its 8 key/value heads to the 32 query heads (``repeat_interleave``) before SDPA, so the
replayed forward's eager attention (:class:`~.llm_graphs.ExactAttention`) copies every layer's whole history
twice per token: at 2,600 positions that is 1.5 GB written and read again per forward, and 72 extra launches.
SDPA can take the 8 heads as they are (``enable_gqa``): each query head then reads its group's key/value head
from the store's own exact-length view. The arithmetic per query head is the same, but whether the kernel
gives the same bits is the device's and library's to say, so it runs only where the start-up self-check
(:func:`prepare`, an :func:`engine.fastpath.self_check` "grouped-query attention without widening") found the
outputs ``torch.equal`` to the widened path's at this model's head layout, over fresh random queries and
histories. The check runs by bands of history length (:data:`BANDS`), each at every multiple of 64 positions and
either side of it (every key-block count the kernels' tiling and split choices see) and at its edges, and the
grouped call runs up to the end of the last band of an unbroken run of passes from 1 on: on the H200 the grouped
call matched up to 1,000 positions and differed at 2,047 (a split of the keys chosen differently, most likely), so
an all-or-nothing verdict kept the copies everywhere. Each band's verdict is cached per device, libraries and code;
``DUPLEXCADENCE_REFERENCE_PATHS=1`` keeps the widening copies. CUDA only: the CPU runs the eager stock path
everywhere.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

from engine import fastpath

PATH = "grouped-query attention without widening"
LENGTHS = (1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 1000, 2047, 2048, 2049, 2600, 4095, 8192, 12289,
           16384)
#: the bands of history length the check decides one by one: (first, last) positions
BANDS = tuple(zip((1,) + tuple(range(513, 4097, 512)) + (4097, 8193, 12289),
                  tuple(range(512, 4097, 512)) + (8192, 12288, 16384)))
_lock = threading.Lock()
_up_to: Dict[int, int] = {}             # CUDA device index -> the longest history the grouped call runs over


def up_to(device) -> int:
    """The longest history (positions) over which one-query attention on ``device`` skips the widening copies
    (0: never)."""
    dev = torch.device(device)
    return _up_to.get(dev.index if dev.index is not None else 0, 0) if dev.type == "cuda" else 0


def chosen(device) -> bool:
    """Whether one-query attention on ``device`` skips the widening copies over some histories."""
    return up_to(device) > 0


def band_lengths(first: int, last: int) -> Tuple[int, ...]:
    """The history lengths one band's check runs: its edges, every multiple of 64 in it and either side of it,
    and the tile boundaries of :data:`LENGTHS` that fall in it."""
    near = {m + d for m in range(64, last + 65, 64) for d in (-1, 0, 1)}
    return tuple(sorted(n for n in near | set(LENGTHS) | {first, last} if first <= n <= last))


def widen(src: torch.Tensor, n: int, group: int) -> torch.Tensor:
    """Keys or values ``src`` [1, Hkv, 1, capacity, hd] (a store's view with a unit group axis) over the first
    ``n`` positions, widened by one broadcasting copy into a fresh [1, Hkv * group, n, hd]: each key/value head
    copied into its group of query heads, the values and layout ``repeat_interleave`` gives. The eager attention
    (:class:`~.llm_graphs.ExactAttention`) and this module's reference both call it."""
    _, hkv, _, _, hd = src.shape
    out = torch.empty(1, hkv, group, n, hd, dtype=src.dtype, device=src.device)
    out.copy_(src.narrow(3, 0, n))
    return out.view(1, hkv * group, n, hd)


def widened(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
    """The reference: keys/values [1, Hkv, n, hd] widened as the stock path widens them, then SDPA on contiguous
    operands."""
    n = k.shape[2]
    return F.scaled_dot_product_attention(q.contiguous(), widen(k.unsqueeze(2), n, group),
                                          widen(v.unsqueeze(2), n, group))


def grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The candidate: SDPA over the key/value heads as they are (views into the store)."""
    return F.scaled_dot_product_attention(q.contiguous(), k, v, enable_gqa=True)


def prepare(device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
            on_cpu: bool = False) -> fastpath.Verdict:
    """Check the grouped call against the widened one on ``device`` at this head layout, band by band (before any
    capture); one verdict for people, ``scope`` naming how far the call runs when not over every band.
    ``on_cpu``: run the check on the CPU too (tests of the check itself; the CPU path never takes the call)."""
    dev = torch.device(device)
    if dev.type != "cuda" and not on_cpu:
        return fastpath.Verdict(PATH, False, "not applicable: the CPU runs the stock attention")
    if heads == kv_heads or heads % kv_heads:
        return fastpath.Verdict(PATH, False, "not applicable: no grouped heads")
    longest, verdicts = check_bands(dev, heads, kv_heads, head_dim, dtype)
    if longest and dev.type == "cuda":
        with _lock:
            _up_to[dev.index if dev.index is not None else torch.cuda.current_device()] = longest
    return summary(longest, verdicts)


def check_bands(dev: torch.device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
                ) -> Tuple[int, List[fastpath.Verdict]]:
    """Each band's verdict in order until the first refusal: (the last position of the unbroken run of passes
    from 1, or 0; the verdicts checked)."""
    made: List[tuple] = []
    verdicts: List[fastpath.Verdict] = []
    longest = 0
    for first, last in BANDS:
        lengths = band_lengths(first, last)

        def trial(on: bool, lengths=lengths):
            if not made:
                made.append(_inputs(dev, heads, kv_heads, head_dim, dtype))
            q, k, v = made[0]
            outs = []
            for n in lengths:
                kn, vn = k.narrow(2, 0, n), v.narrow(2, 0, n)          # the store's views: capacity-strided
                outs.append(grouped(q, kn, vn) if on else widened(q, kn, vn, heads // kv_heads))
            return outs

        v = fastpath.self_check(f"{PATH}, {first:,}-{last:,} positions", dev,
                                (heads, kv_heads, head_dim, str(dtype), lengths), trial)
        verdicts.append(v)
        if not v.chosen:
            break
        longest = last
    return longest, verdicts


def summary(longest: int, verdicts: List[fastpath.Verdict]) -> fastpath.Verdict:
    """One verdict for the bands: on up to ``longest`` positions, with the first refusal's reason past it."""
    refused = next((v for v in verdicts if not v.chosen), None)
    checked = sum(len(band_lengths(first, last)) for first, last in BANDS if last <= longest)
    cached = all(v.cached for v in verdicts)
    if not longest:
        return fastpath.Verdict(PATH, False, refused.reason, refused.max_abs_diff, cached)
    passed = f"bit-identical to the reference at every checked length from 1 to {longest:,} positions ({checked} lengths)"
    if refused is None:
        return fastpath.Verdict(PATH, True, passed, 0.0, cached)
    band = refused.path[len(PATH) + 2:]
    return fastpath.Verdict(PATH, True, f"{passed}; past it the widening copies ({band}: {refused.reason})",
                            refused.max_abs_diff, cached, scope=f"up to {longest:,} positions")


def forget() -> None:
    """Back to the widening copies everywhere (tests)."""
    with _lock:
        _up_to.clear()


def _inputs(dev, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """A query [1, H, 1, hd] and a store's keys/values [1, Hkv, capacity, hd] (capacity past the longest length,
    so the views are strided as the store's), fresh random values with every head its own scale."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    cap = BANDS[-1][1] + 100

    def rand(*shape):
        x = torch.randn(*shape, generator=g) * torch.empty(1, shape[1], 1, 1).uniform_(0.1, 4.0, generator=g)
        return x.to(dtype).to(dev)
    return rand(1, heads, 1, head_dim), rand(1, kv_heads, cap, head_dim), rand(1, kv_heads, cap, head_dim)
