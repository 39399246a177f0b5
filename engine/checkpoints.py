"""Checks every checkpoint loader applies to the tensors it takes: floating point and finite.

A checkpoint with NaN or infinite weights decodes NaN audio from the first step, and an integer
tensor where a weight belongs means the file is not what its name says; both are refused with one
line naming the file and the tensor, before a model is built.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Tuple

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


def pick_expected(state: Mapping[str, torch.Tensor], expected: Mapping[str, Tuple[int, ...]], source: str,
                  what: str, alias: Optional[Callable[[str], str]] = None) -> Dict[str, torch.Tensor]:
    """The tensors ``expected`` names (key -> shape), checked and as float32; one ValueError for every problem.

    ``alias`` maps a key to the other spelling a checkpoint may use. The error says ``source is not
    {what}``, then how many keys are missing and mis-shaped, with the first few of each.
    """
    missing: List[str] = []
    wrong: List[str] = []
    out: Dict[str, torch.Tensor] = {}
    for key, shape in expected.items():
        t = state.get(key)
        if t is None and alias is not None:
            t = state.get(alias(key))
        if t is None:
            missing.append(key)
        elif tuple(t.shape) != tuple(shape):
            wrong.append(f"{key}: {tuple(t.shape)}, expected {tuple(shape)}")
        else:
            check_tensor(key, t, source)
            out[key] = t.detach().to(torch.float32)
    if missing or wrong:
        parts = [f"{len(missing)} missing key(s), e.g. " + ", ".join(missing[:4])] if missing else []
        parts += [f"{len(wrong)} mis-shaped key(s): " + "; ".join(wrong[:4])] if wrong else []
        raise ValueError(f"{source} is not {what}: {'; '.join(parts)}")
    return out
