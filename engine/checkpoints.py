"""Checks every checkpoint loader applies to the tensors it takes: floating point and finite.

A checkpoint with NaN or infinite weights decodes NaN audio from the first step, and an integer
tensor where a weight belongs means the file is not what its name says; both are refused with one
line naming the file and the tensor, before a model is built.
"""
from __future__ import annotations

from typing import Mapping

import torch


def check_tensor(name: str, t: torch.Tensor, source: str) -> None:
    """ValueError naming ``source`` and ``name`` unless ``t`` is a floating-point tensor of finite values."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{source}: {name} is a {type(t).__name__}, not a tensor")
    if not t.dtype.is_floating_point:
        raise ValueError(f"{source}: tensor {name} is {str(t.dtype).replace('torch.', '')}, "
                         f"expected floating-point weights")
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        raise ValueError(f"{source}: tensor {name} holds {int(bad.sum())} NaN or infinite value(s) "
                         f"of {t.numel()}; the checkpoint is damaged")


def check_tensors(state: Mapping[str, torch.Tensor], source: str) -> None:
    """:func:`check_tensor` for every entry of ``state``."""
    for name, t in state.items():
        check_tensor(name, t, source)
