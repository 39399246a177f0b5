"""How much memory the session's card has: the card's total and the process cap, for the session's info.

The app draws them as horizontal lines over the per-second reserved bytes (``SecondRecord.reserved_bytes``,
read from the torch allocator after each second), so a user sees how close a session is to the card's size.
On the CPU neither applies: both are None (never a made-up number).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

MIB = float(1 << 20)


def device_memory(device) -> Dict[str, Optional[float]]:
    """``device_memory_mib``: the card's total memory; ``memory_cap_mib``: total x the per-process fraction
    when ``torch.cuda.set_per_process_memory_fraction`` set one below 1 (else None). Both None on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return {"device_memory_mib": None, "memory_cap_mib": None}
    total = float(torch.cuda.get_device_properties(device).total_memory)
    index = device.index if device.index is not None else torch.cuda.current_device()
    fraction = float(torch.cuda.get_per_process_memory_fraction(index))
    cap = round(total * fraction / MIB, 3) if 0 < fraction < 1 else None
    return {"device_memory_mib": round(total / MIB, 3), "memory_cap_mib": cap}
