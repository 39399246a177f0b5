"""Test-only oracle: Kyutai's own Mimi (the ``moshi`` package, installed with --no-deps).

The loading code lives with the benchmark (``engine.bench.mimi``: it stubs the download and
tokenizer imports that moshi's loaders pull in but the decode path never calls; ``einops``, which
the decode path does use, must be the real package). The product never imports moshi.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from engine.bench.mimi import peer_available, peer_context, peer_mimi


def available() -> bool:
    return peer_available()


def build(cfg, state: Dict[str, torch.Tensor], device="cpu", num_codebooks: int = 8):
    """moshi's ``get_mimi(None, config)`` + ``load_state_dict`` of our moshi-layout weights."""
    return peer_mimi(cfg, state, device, num_codebooks)


@torch.no_grad()
def stream_decode(mimi, codes: torch.Tensor, compiled: bool = False) -> torch.Tensor:
    """moshi's streaming decode, one frame per call, in ``mimi.streaming(1)``: codes [K, N] -> [1, 1, N*fs].

    ``compiled=False`` keeps moshi's RoPE out of ``torch.compile`` on CUDA (its eager arithmetic).
    """
    out: List[torch.Tensor] = []
    with peer_context(graphs=True, compiled=compiled), mimi.streaming(1):
        for t in range(codes.shape[1]):
            out.append(mimi.decode(codes[None, :, t:t + 1]).clone())
    return torch.cat(out, dim=-1)
