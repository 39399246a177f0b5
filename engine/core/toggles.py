"""The engine's optimization toggles: one frozen type from the UI to the executor.

:class:`Toggles` is immutable; a change is a new value (:meth:`Toggles.merged`), and every layer takes
one whole value: ``set_toggles(Toggles)`` (the app, the runners, the session, the host, tails, backbones,
the executor). It reads like a dict (``t["graph_replay"]``, ``dict(t)``) for records and reports. The
rules live here and nowhere else: what a session asks of its models on a device (:meth:`Toggles.on`:
graph replay only where CUDA can run it) and what can run (:meth:`Toggles.effective`: graphs also need
demand-sized state). A layer that parks a request for its next step holds a :class:`PendingToggles`.
"""
from __future__ import annotations

import threading
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

    def on(self, device) -> "Toggles":
        """What a session asks of its models on ``device``: graph replay only where CUDA can run it (the
        request itself stays with the session), demand-sized state as asked."""
        return Toggles(self.demand_sized, self.graph_replay and graphs_can_run(device))

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


class PendingToggles:
    """A request parked for the next step: asked from any thread (the GUI, a socket), taken once by the
    thread that runs the steps, at its next boundary. :attr:`asked` is the latest request, taken or not
    (a partial change, say a protocol message that names one toggle, is merged into it)."""

    def __init__(self, asked: Toggles):
        self._lock = threading.Lock()
        self._asked = asked
        self._pending: Optional[Toggles] = None

    def ask(self, toggles: Toggles) -> None:
        if not isinstance(toggles, Toggles):
            raise TypeError(f"set_toggles takes a Toggles value (engine.core.toggles), got {type(toggles).__name__}")
        with self._lock:
            self._asked = self._pending = toggles

    def take(self) -> Optional[Toggles]:
        """The request not yet taken (None when there is none); each request is handed over once."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    @property
    def asked(self) -> Toggles:
        with self._lock:
            return self._asked
