"""Test-only oracle: Kyutai's own Mimi (the ``moshi`` package, installed with --no-deps).

``moshi.models.loaders`` imports ``huggingface_hub`` and ``sentencepiece`` at module level for
downloads and the text tokenizer, neither of which the Mimi decode path touches; where they are
not installed, inert stand-ins are registered so the import succeeds (``einops``, which the decode
path does use, must be the real package). The product never imports this file or moshi.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from typing import Dict, List

import torch


def _stub_missing() -> None:
    if importlib.util.find_spec("huggingface_hub") is None and "huggingface_hub" not in sys.modules:
        hub = types.ModuleType("huggingface_hub")
        errors = types.ModuleType("huggingface_hub.errors")

        def _no_download(*_a, **_k):
            raise RuntimeError("the Mimi oracle never downloads (huggingface_hub is not installed)")
        hub.hf_hub_download = _no_download
        errors.EntryNotFoundError = type("EntryNotFoundError", (Exception,), {})
        hub.errors = errors
        sys.modules["huggingface_hub"] = hub
        sys.modules["huggingface_hub.errors"] = errors
    if importlib.util.find_spec("sentencepiece") is None and "sentencepiece" not in sys.modules:
        sp = types.ModuleType("sentencepiece")
        sp.SentencePieceProcessor = type("SentencePieceProcessor", (), {})
        sys.modules["sentencepiece"] = sp


def available() -> bool:
    """Whether moshi (and the real einops it computes with) can be imported."""
    return importlib.util.find_spec("moshi") is not None and importlib.util.find_spec("einops") is not None


def build(cfg, state: Dict[str, torch.Tensor], device="cpu", num_codebooks: int = 8):
    """moshi's ``get_mimi(None, config)`` with our moshi-layout decoder weights loaded (strict)."""
    _stub_missing()
    from moshi.models import loaders
    mimi = loaders.get_mimi(None, cfg.moshi_kwargs(), device=device, num_codebooks=num_codebooks)
    full = mimi.state_dict()
    unknown = set(state) - set(full)
    if unknown:
        raise KeyError(f"keys not in moshi's Mimi: {sorted(unknown)[:4]}")
    full.update({k: v.to(device) for k, v in state.items()})
    mimi.load_state_dict(full, strict=True)
    mimi.eval()
    return mimi


@torch.no_grad()
def stream_decode(mimi, codes: torch.Tensor) -> List[torch.Tensor]:
    """moshi's streaming decode, one frame per call: codes [K, N] -> N chunks [1, 1, frame_size]."""
    out = []
    with mimi.streaming(1):
        for t in range(codes.shape[1]):
            out.append(mimi.decode(codes[None, :, t:t + 1]).clone())
    return out
