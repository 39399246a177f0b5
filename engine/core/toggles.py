"""The engine's optimization toggles, as every layer (executor, tails, backbones, session) takes them."""
from __future__ import annotations

from typing import Dict, Optional

NAMES = ("demand_sized", "graph_replay")


def requested(demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> Dict[str, bool]:
    """The toggles a ``set_toggles`` call names, as bools (``None`` leaves a toggle as it is)."""
    return {k: bool(v) for k, v in zip(NAMES, (demand_sized, graph_replay)) if v is not None}
