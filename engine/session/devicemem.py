"""A card too small for a session: one clear line instead of an allocator's out-of-memory trace.

:class:`Guard` (one per session) wraps its build and each second: a CUDA out-of-memory error there becomes
:class:`DeviceTooSmall`, whose one line names the card, its size and what was free when the session
began building, what this configuration was measured to need where its backbone declares it
(``BackboneEntry.measured_memory``), and what to do. The allocator's cache is emptied first, so the process
(and the host's other sessions) go on.
"""
from __future__ import annotations

import re
from typing import Optional, Tuple

import torch

from engine import registry

from .card_memory import device_memory

GIB = float(1 << 30)


def measured(backbone: Optional[str], size: Optional[str]) -> Optional[registry.MeasuredMemory]:
    """What a session of ``backbone`` at ``size`` was measured to reserve, as its entry declares (None: unknown)."""
    if backbone not in registry.backbone_names():
        return None
    return registry.get_backbone(str(backbone)).memory_for(str(size))


class DeviceTooSmall(RuntimeError):
    """The session does not fit in the GPU memory this process may use."""


def _sizes(device: torch.device) -> Tuple[float, Optional[float]]:
    """(total GiB, this process's cap in GiB or None) of a CUDA device, from :func:`device_memory`."""
    mib = device_memory(device)
    cap = mib["memory_cap_mib"]
    return mib["device_memory_mib"] / 1024, (cap / 1024 if cap else None)


def message(device: torch.device, backbone: Optional[str], size: Optional[str], doing: str,
            free_before: Optional[float], error: str = "") -> str:
    name, (total, cap) = torch.cuda.get_device_name(device), _sizes(device)
    free_at = free_before if free_before is not None else free_gib(device)
    room = f"{free_at:.1f} GiB was free" + (f", and this process may use {cap:.1f} GiB (its memory cap)" if cap else "")
    need = measured(backbone, size)
    needs = f"; this configuration was measured to reserve {need.gib:.1f} GiB ({need.where})" if need else ""
    tried = re.search(r"Tried to allocate [0-9.]+ [KMG]iB", error)
    at = f" (t{tried.group(0)[1:]})" if tried else ""
    return (f"not enough GPU memory {doing}{at}: {name} has {total:.1f} GiB, {room}{needs}. Use a larger card, "
            f"close other sessions or programs on it, or choose a smaller size")


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "CUDA out of memory" in str(e))


class Guard:
    """A session's out-of-memory guard, built once and entered around its build and each second: a CUDA
    out-of-memory error in the block becomes :class:`DeviceTooSmall` (one line); anything else passes."""

    def __init__(self, device: torch.device, backbone: Optional[str], size: Optional[str]):
        self.device = torch.device(device)
        self.backbone, self.size = backbone, size
        self.doing, self.free_before = "", None

    def __call__(self, doing: str, free_before: Optional[float] = None) -> "Guard":
        """This guard, set for the next block: what the session does in it, and the GiB free before."""
        self.doing, self.free_before = doing, free_before
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error: Optional[BaseException], trace) -> bool:
        if error is None or self.device.type != "cuda" or not _is_oom(error):
            return False
        torch.cuda.empty_cache()
        raise DeviceTooSmall(message(self.device, self.backbone, self.size, self.doing, self.free_before,
                                     str(error))) from None


def free_gib(device: torch.device) -> Optional[float]:
    """Free GiB on a CUDA device now (None elsewhere)."""
    return torch.cuda.mem_get_info(device)[0] / GIB if torch.device(device).type == "cuda" else None
