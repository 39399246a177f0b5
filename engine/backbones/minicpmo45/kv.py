"""Key/value histories whose length the data decides: the LLM's session KV and the TTS's per-turn KV.

How many tokens a second adds to the LLM (a listening second 13, a speaking one up to 33) or to the
TTS (a turn's text and codes) depends on what the model says, so these are the core's *data-clocked*
regions (:mod:`engine.core.growing`): :func:`kv_regions` declares keys and values ``[layers, Hkv, T, hd]``
on a :class:`~engine.core.growing.DataClock` of the second's worst case with a
:class:`~engine.core.regions.Horizon` retention, and the planner sizes them (:func:`demand_units` runs
:func:`~engine.core.planner.make_plan` over the session's seconds at that worst case).

The stores here are the core's growth policies with the attention layers' handle (:meth:`KVStore.layer`):

* :class:`GrowingKV` — the core's stock policy (HF ``DynamicCache``: per layer ``torch.cat`` every forward);
  ``k`` / ``v`` are its per-layer tensors.
* :class:`DemandKV` — the core's demand policy: allocated once at the planner's demand, written in place,
  exact-length views (the positions and bits of stock) at stable addresses, which the TTS's decode graphs
  and the LLM's layer graphs replay over; ``k_buf`` / ``v_buf`` are its storage. The backbone opens a step
  per second (``begin_step``), so a store that must grow (a session past its planned minute, a TTS history
  carried over cut replies) does so before the second starts, never inside it; ``grown`` counts the moves
  and the graph owners capture again after one.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import torch

from engine.core import Horizon, Region, SessionSpec, make_plan
from engine.core.growing import DemandGrowth, GrowingStore, StockGrowth, data_clock, move_contents


def kv_regions(prefix: str, layers: int, kv_heads: int, head_dim: int, per_step: int, horizon: int,
               dtype: torch.dtype, note: str) -> List[Region]:
    """Key and value regions ``[layers, Hkv, T, hd]`` advancing at most ``per_step`` per step."""
    clock = data_clock(f"{prefix}-tokens", int(per_step))
    shape = (layers, kv_heads, None, head_dim)
    keep = Horizon(int(horizon))
    return [Region(f"{prefix}_k", shape, clock, keep, dtype=dtype, stock_note=note, doc="keys after RoPE"),
            Region(f"{prefix}_v", shape, clock, keep, dtype=dtype, stock_note=note, doc="values")]


def demand_units(regions: List[Region], steps: int, prefix: int = 0) -> int:
    """Units the planner says the regions need over ``steps`` worst-case steps after ``prefix``."""
    spec = SessionSpec(steps=int(steps), prefix={r.name: int(prefix) for r in regions}, label="kv")
    plan = make_plan(regions, spec)
    return max(plan.demand[r.name] for r in regions)


def _pair(region_k: Region, layers: int) -> Tuple[Region, Region]:
    """The key region and its value region (same shape, clock and horizon)."""
    if region_k.shape[0] != layers:
        raise ValueError(f"{region_k.name}: declared for {region_k.shape[0]} layers, store asked for {layers}")
    stem = region_k.name[:-2] if region_k.name.endswith("_k") else region_k.name
    return region_k, dataclasses.replace(region_k, name=f"{stem}_v", doc="values")


class _Layer:
    """One layer's view of a KV store (what :class:`~.layers.Attention` talks to)."""

    def __init__(self, store: "KVStore", index: int):
        self.store, self.index = store, index

    def append(self, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.store.append(self.index, k, v)


class KVStore(GrowingStore):
    """A growing store of keys and values with per-layer handles; ``commit(t)`` after a forward of ``t``."""

    def _kv_init(self, layers: int) -> None:
        self.region, self.layers = self.regions[0], int(layers)
        self._handles = [_Layer(self, i) for i in range(self.layers)]

    def layer(self, i: int) -> _Layer:
        return self._handles[i]

    def export(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Copies of the history: [layers, Hkv, L, hd] keys and values."""
        c = self.contents()
        return c[self.names[0]], c[self.names[1]]

    def load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.load_contents({self.names[0]: k, self.names[1]: v})

    def nbytes(self) -> int:
        return self.state_bytes()


class GrowingKV(KVStore, StockGrowth):
    """Stock: per layer a fresh ``torch.cat([cache, new])`` every forward (HF DynamicCache)."""

    def __init__(self, region_k: Region, layers: int, device):
        StockGrowth.__init__(self, _pair(region_k, layers), device)
        self._kv_init(layers)

    @property
    def k(self) -> list:
        return self.parts_of[self.names[0]]

    @property
    def v(self) -> list:
        return self.parts_of[self.names[1]]


class DemandKV(KVStore, DemandGrowth):
    """Allocated once at ``capacity`` positions; in-place writes; exact-length views (stable addresses).
    ``growable``: past its room the store migrates to twice the room (up to the horizon), ``grown`` + 1.
    ``sink``: one more position allocated past the room, at index ``capacity`` (:attr:`sink`), that no history
    reaches and no attention reads: where a group step writes the key and value of a session that sits it out
    (:mod:`.batched_llm`), so the write never lands on the history of a session whose own work runs on its own
    stream meanwhile."""

    def __init__(self, region_k: Region, layers: int, capacity: int, device, growable: bool = False,
                 sink: bool = False):
        self.spare = 1 if sink else 0
        DemandGrowth.__init__(self, _pair(region_k, layers), device, capacity, growable)
        self._kv_init(layers)

    @property
    def sink(self) -> Optional[int]:
        """The sink's position (the first past the room, so it moves with a growth), or None without one."""
        return self.capacity if self.spare else None

    @property
    def k_buf(self) -> torch.Tensor:                     # [layers, Hkv, capacity, hd]
        return self.storage[self.names[0]]

    @property
    def v_buf(self) -> torch.Tensor:
        return self.storage[self.names[1]]

    def _room(self, end: int) -> None:
        """Room for ``end`` positions (a graph owner about to write past the room, outside a step)."""
        self.ensure(end)


def make_store(demand: bool, region_k: Region, layers: int, capacity: int, device, growable: bool = False,
               sink: bool = False) -> KVStore:
    if demand:
        return DemandKV(region_k, layers, capacity, device, growable, sink)
    return GrowingKV(region_k, layers, device)


def switch_store(store: KVStore, demand: bool, capacity: int, device, growable: bool = False,
                 sink: bool = False) -> KVStore:
    """The same history in the other policy (bit-exact copies); the store itself when nothing changes."""
    if (store.kind == "demand") == bool(demand):
        return store
    return move_contents(store, make_store(demand, store.region, store.layers, capacity, device, growable, sink))
