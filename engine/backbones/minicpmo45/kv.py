"""Key/value histories whose length the data decides: the LLM's session KV and the TTS's per-turn KV.

How many tokens a second adds to the LLM (a listening second 13, a speaking one up to 33) or to the
TTS (a turn's text and codes) depends on what the model says, so these regions cannot be replayed
step by step from a fixed timeline. They are still declared through the engine
(:class:`~engine.core.regions.Region` with a :class:`~engine.core.regions.Horizon` retention and a
worst-case clock), and the planner sizes them: :func:`demand_units` runs
:func:`~engine.core.planner.make_plan` over the session's seconds at the clock's worst case.

* :class:`GrowingKV` is the stock policy (HF ``DynamicCache``): every forward makes new tensors with
  ``torch.cat``.
* :class:`DemandKV` allocates once at the planner's demand, writes in place and hands back an exact
  length view, so attention runs over the same positions as stock and gives the same bits; its
  addresses never move, which lets the TTS replay CUDA graphs over it. The LLM's store is planned for
  the session's first minute and doubles (one copy) if the session outlives that; the LLM runs
  eagerly, so nothing depends on its addresses.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from engine.core import Clock, Horizon, Region, SessionSpec, make_plan


def kv_regions(prefix: str, layers: int, kv_heads: int, head_dim: int, per_step: int, horizon: int,
               dtype: torch.dtype, note: str) -> List[Region]:
    """Key and value regions ``[layers, Hkv, T, hd]`` advancing at most ``per_step`` per step."""
    clock = Clock(f"{prefix}-tokens", (int(per_step),))
    shape = (layers, kv_heads, None, head_dim)
    keep = Horizon(int(horizon))
    return [Region(f"{prefix}_k", shape, clock, keep, dtype=dtype, stock_note=note, doc="keys after RoPE"),
            Region(f"{prefix}_v", shape, clock, keep, dtype=dtype, stock_note=note, doc="values")]


def demand_units(regions: List[Region], steps: int, prefix: int = 0) -> int:
    """Units the planner says the regions need over ``steps`` worst-case steps after ``prefix``."""
    spec = SessionSpec(steps=int(steps), prefix={r.name: int(prefix) for r in regions}, label="kv")
    plan = make_plan(regions, spec)
    return max(plan.demand[r.name] for r in regions)


class _Layer:
    """One layer's view of a KV store (what :class:`~.layers.Attention` talks to)."""

    def __init__(self, store: "KVStore", index: int):
        self.store, self.index = store, index

    def append(self, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.store._append(self.index, k, v)


class KVStore:
    """Base: ``length`` positions held; ``layer(i)`` handles; ``commit(t)`` after a forward of ``t`` tokens."""

    kind = "abstract"

    def __init__(self, region_k: Region, layers: int):
        self.region = region_k
        self.layers = layers
        self.length = 0
        self._handles = [_Layer(self, i) for i in range(layers)]

    def layer(self, i: int) -> _Layer:
        return self._handles[i]

    def commit(self, t: int) -> None:
        self.length += int(t)

    def reset(self) -> None:
        self.length = 0

    def export(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Copies of the history: [layers, Hkv, L, hd] keys and values."""
        raise NotImplementedError

    def load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        raise NotImplementedError

    def nbytes(self) -> int:
        raise NotImplementedError

    def _append(self, i: int, k: torch.Tensor, v: torch.Tensor):
        raise NotImplementedError


class GrowingKV(KVStore):
    """Stock: per layer a fresh ``torch.cat([cache, new])`` every forward (HF DynamicCache)."""

    kind = "stock"

    def __init__(self, region_k: Region, layers: int, device):
        super().__init__(region_k, layers)
        self.k: List[Optional[torch.Tensor]] = [None] * layers
        self.v: List[Optional[torch.Tensor]] = [None] * layers

    def _append(self, i, k, v):
        if self.k[i] is None:
            self.k[i], self.v[i] = k, v
        else:
            self.k[i] = torch.cat([self.k[i], k], dim=2)
            self.v[i] = torch.cat([self.v[i], v], dim=2)
        return self.k[i], self.v[i]

    def reset(self) -> None:
        super().reset()
        self.k = [None] * self.layers
        self.v = [None] * self.layers

    def export(self):
        if self.length == 0:
            shape = self.region.shape_at(0)
            z = torch.zeros(shape, dtype=self.region.dtype)
            return z, z.clone()
        return torch.stack([t[0] for t in self.k]), torch.stack([t[0] for t in self.v])

    def load(self, k, v):
        self.length = int(k.shape[2])
        if self.length == 0:
            self.reset()
            return
        self.k = [k[i:i + 1].clone() for i in range(self.layers)]
        self.v = [v[i:i + 1].clone() for i in range(self.layers)]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)


class DemandKV(KVStore):
    """Allocated once at ``capacity`` positions; in-place writes; exact-length views (stable addresses).

    ``growable``: a session that outlives the planned horizon gets twice the room (one copy; up to the
    region's :class:`~engine.core.regions.Horizon`) instead of an error. ``grown`` counts the moves: the
    graphs that read the store (the LLM's layer graphs, the TTS's decode graphs) are captured again
    after one."""

    kind = "demand"

    def __init__(self, region_k: Region, layers: int, capacity: int, device, growable: bool = False):
        super().__init__(region_k, layers)
        self.capacity = int(capacity)
        self.growable = growable
        self.grown = 0
        shape = region_k.shape_at(self.capacity)
        self.k_buf = torch.zeros(shape, dtype=region_k.dtype, device=device)     # [layers, Hkv, C, hd]
        self.v_buf = torch.zeros(shape, dtype=region_k.dtype, device=device)

    def _room(self, end: int) -> None:
        limit = getattr(self.region.retention, "max_units", self.capacity)
        if not self.growable or end > limit:
            raise RuntimeError(f"{self.region.name}: {end} positions exceed the horizon of "
                               f"{self.capacity if not self.growable else limit} (start a new session)")
        cap = min(limit, max(2 * self.capacity, end))
        k, v = self.k_buf[:, :, :self.length], self.v_buf[:, :, :self.length]
        shape = self.region.shape_at(cap)
        self.k_buf = torch.zeros(shape, dtype=k.dtype, device=k.device)
        self.v_buf = torch.zeros(shape, dtype=v.dtype, device=v.device)
        self.k_buf[:, :, :self.length].copy_(k)
        self.v_buf[:, :, :self.length].copy_(v)
        self.capacity = cap
        self.grown += 1

    def _append(self, i, k, v):
        t = k.shape[2]
        end = self.length + t
        if end > self.capacity:
            self._room(end)
        self.k_buf[i, :, self.length:end].copy_(k[0])
        self.v_buf[i, :, self.length:end].copy_(v[0])
        return self.k_buf[i:i + 1, :, :end], self.v_buf[i:i + 1, :, :end]

    def export(self):
        return self.k_buf[:, :, :self.length].clone(), self.v_buf[:, :, :self.length].clone()

    def load(self, k, v):
        n = int(k.shape[2])
        if n > self.capacity:
            self._room(n)
        self.k_buf[:, :, :n].copy_(k)
        self.v_buf[:, :, :n].copy_(v)
        self.length = n

    def nbytes(self) -> int:
        return 2 * self.k_buf.numel() * self.k_buf.element_size()


def make_store(demand: bool, region_k: Region, layers: int, capacity: int, device, growable: bool = False
               ) -> KVStore:
    if demand:
        return DemandKV(region_k, layers, capacity, device, growable)
    return GrowingKV(region_k, layers, device)


def switch_store(store: KVStore, demand: bool, capacity: int, device, growable: bool = False) -> KVStore:
    """The same history in the other policy (bit-exact copies); the store itself when nothing changes."""
    if (store.kind == "demand") == bool(demand):
        return store
    k, v = store.export()
    new = make_store(demand, store.region, store.layers, capacity, device, growable)
    new.load(k.to(device), v.to(device))
    return new
