"""Host values to the device without stalling the host: index lists copied through pinned memory.

``torch.tensor(ids, device="cuda")`` copies from pageable memory, and PyTorch makes such a copy wait for the
stream (a ``cudaStreamSynchronize``): every token id a second feeds would drain the GPU's queue, and the host
could not launch the next kernels while the GPU still runs the previous ones. :func:`device_ids` builds the
list in pinned (page-locked) memory and copies it asynchronously on the current stream; the caching host
allocator keeps that pinned block until the copy has completed, so it is never rewritten under the copy. The
values are the same int64 ids, so whatever reads them computes the same bits.
"""
from __future__ import annotations

from typing import Sequence

import torch


def device_ids(ids: Sequence[int], device) -> torch.Tensor:
    """``ids`` as an int64 tensor [len(ids)] on ``device``; on CUDA copied without a stream synchronization."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return torch.tensor(list(ids), dtype=torch.long, device=dev)
    host = torch.tensor(list(ids), dtype=torch.long, pin_memory=True)
    return host.to(dev, non_blocking=True)


def count_codes(window: torch.Tensor, categories: int, dtype: torch.dtype) -> torch.Tensor:
    """How often each of ``categories`` codes occurs in ``window`` [w] (int64), as ``dtype`` [1, categories]:
    ``torch.bincount(window, minlength=categories)`` cast to ``dtype`` (exact: small integer counts), without
    the host synchronization CUDA's bincount makes to size its output from the largest code."""
    count = torch.zeros(1, categories, dtype=dtype, device=window.device)
    ones = torch.ones(1, window.shape[0], dtype=dtype, device=window.device)
    return count.scatter_add_(1, window.view(1, -1), ones)
