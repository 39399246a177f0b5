"""The engine's optimization toggles: one frozen type for every layer (executor, tails, backbones, session).

:class:`Toggles` is immutable; a change is a new value (:meth:`Toggles.merged`). It reads like the
plain dict earlier code passed around (``t["graph_replay"]``, ``dict(t)``), so callers that only
look at it need no change. One rule decides whether graph replay can run: :meth:`Toggles.effective`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Dict, Iterator, Optional

import torch

NAMES = ("demand_sized", "graph_replay")
#: engine modes by name, as the CLIs and benchmarks spell them
MODES = ("stock", "demand", "graphs")


def requested(demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> Dict[str, bool]:
    """The toggles a ``set_toggles`` call names, as bools (``None`` leaves a toggle as it is)."""
    return {k: bool(v) for k, v in zip(NAMES, (demand_sized, graph_replay)) if v is not None}


def graphs_can_run(device) -> bool:
    """Whether CUDA graph replay can run on ``device`` at all (a CUDA device and a CUDA build)."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


@dataclass(frozen=True, eq=False)
class Toggles(Mapping):
    """Demand-sized state arenas and exact-shape graph replay, as asked for or as in effect."""

    demand_sized: bool = True
    graph_replay: bool = False

    @classmethod
    def from_mode(cls, mode: str) -> "Toggles":
        """``stock`` (stock-like state, eager), ``demand`` (demand-sized, eager), ``graphs`` (both)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of: {', '.join(MODES)}")
        return cls(demand_sized=mode != "stock", graph_replay=mode == "graphs")

    def merged(self, demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> "Toggles":
        """A copy with the named toggles changed (``None`` keeps a toggle)."""
        return Toggles(**{**dict(self), **requested(demand_sized, graph_replay)})

    def effective(self, device) -> "Toggles":
        """What can run on ``device``: graph replay needs CUDA and demand-sized state (graphs bake the
        demand arena's addresses in)."""
        return Toggles(self.demand_sized, self.graph_replay and self.demand_sized and graphs_can_run(device))

    @property
    def mode(self) -> str:
        if self.graph_replay and self.demand_sized:
            return "graphs"
        return "demand" if self.demand_sized else "stock"

    # -- read like a dict -------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> bool:
        if name not in NAMES:
            raise KeyError(name)
        return bool(getattr(self, name))

    def __iter__(self) -> Iterator[str]:
        return iter(NAMES)

    def __len__(self) -> int:
        return len(NAMES)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __hash__(self) -> int:
        return hash((self.demand_sized, self.graph_replay))
