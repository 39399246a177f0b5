"""State arenas: where the declared regions live during a session.

* :class:`DemandArena` allocates every region **once**, at its planner demand size, before the
  first step. Each step sees views (``narrow`` along the time axis) of the same storage, so every
  address is stable for the whole session and a captured CUDA graph can replay over it. Retention
  is applied in place (forward block copies that never read what they already overwrote).
* :class:`StockArena` is the A/B baseline: it also holds the stock runtime's static buffers (sized
  at its constants) and keeps the live state the way stock code does, as fresh tensors grown with
  ``torch.cat`` and truncated with ``torch.cat`` every step.

A step function never sees which arena it runs on: it talks to :class:`RegionState` handles.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import torch

from .planner import Plan, StepPlan
from .regions import Fixed, Horizon, PrefixWindow, Region, Ring, SlidingWindow, Static


class RegionState:
    """A step's handle on one region.

    * ``get()``   – current contents (``before`` units).
    * ``grow()``  – the working view of ``grown`` units; its first ``before`` units are the current
      contents, the tail ``[before:grown]`` is for this step to fill (see ``tail()``).
    * ``set(x)``  – replace the whole contents of a fixed-size region.
    * ``position()`` – a 0-d int64 **device** tensor: units this region advanced before this step
      (ring write offsets, RoPE positions). Never read it on the host inside a step.
    Retention is applied by the executor after the step (:meth:`commit`).
    """

    def __init__(self, arena: "ArenaBase", region: Region, index: int):
        self.arena = arena
        self.region = region
        self.index = index
        self.length = 0          # units held now (host int, from the plan)
        self.step: Optional[StepPlan] = None

    # -- views -------------------------------------------------------------------------------------
    def get(self) -> torch.Tensor:
        return self.arena._view(self, self.length)

    def grow(self) -> torch.Tensor:
        return self.arena._grow(self)

    def tail(self) -> torch.Tensor:
        g = self.grow()
        ax = self.region.axis
        if self.region.newest_first:       # the new units lead the working view
            return g.narrow(ax, 0, g.shape[ax] - self.length)
        return g.narrow(ax, self.length, g.shape[ax] - self.length)

    def set(self, value: torch.Tensor) -> None:
        self.arena._set(self, value)

    def position(self) -> torch.Tensor:
        return self.arena.counters[self.index]

    @property
    def shape(self):
        return self.region.shape_at(self.length)


class ArenaBase:
    """Common bookkeeping: region handles, lengths from the plan, device-side position counters."""

    kind = "abstract"

    def __init__(self, plan: Plan, device: torch.device):
        self.plan = plan
        self.device = torch.device(device)
        self.states: Dict[str, RegionState] = {}
        for i, r in enumerate(plan.regions):
            self.states[r.name] = RegionState(self, r, i)
        # positions live on the device and advance on the device (inside a captured graph too):
        # the host never writes them between steps, so nothing syncs and nothing is baked in
        self.positions = {r.name: int(plan.spec.prefix.get(r.name, 0)) for r in plan.regions}
        self.counters = torch.zeros(len(plan.regions) + 1, dtype=torch.int64, device=self.device)
        self._sync_counters(0)
        self._advance_vectors: Dict[tuple, torch.Tensor] = {}
        for r in plan.regions:
            self.states[r.name].length = r.retention.initial(int(plan.spec.prefix.get(r.name, 0)))

    def __getitem__(self, name: str) -> RegionState:
        return self.states[name]

    def __iter__(self):
        return iter(self.states.values())

    @property
    def step_counter(self) -> torch.Tensor:
        """0-d int64 device tensor holding the index of the step being run."""
        return self.counters[-1]

    def _sync_counters(self, step_index: int) -> None:
        """Host -> device write of all positions (setup and migration only, never per step)."""
        vals = [self.positions[r.name] for r in self.plan.regions] + [step_index]
        self.counters.copy_(torch.tensor(vals, dtype=torch.int64))

    def begin(self, step: StepPlan) -> None:
        """Point every handle at this step's plan (host bookkeeping only, no device work)."""
        for st in self.states.values():
            st.step = step
            if st.length != step.before[st.region.name]:
                raise RuntimeError(f"region {st.region.name}: holds {st.length} units, plan says "
                                   f"{step.before[st.region.name]} before step {step.index}")

    def commit_device(self, step: StepPlan) -> None:
        """Device side of ending a step: retention in place and counters advanced (capturable)."""
        for st in self.states.values():
            self._retain(st, step)
        key = step.signature
        vec = self._advance_vectors.get(key)
        if vec is None:
            vals = [step.advances[r.clock.name] for r in self.plan.regions] + [1]
            vec = torch.tensor(vals, dtype=torch.int64).to(self.device)
            self._advance_vectors[key] = vec
        self.counters.add_(vec)

    def commit_host(self, step: StepPlan) -> None:
        """Host side of ending a step: lengths and positions from the plan."""
        for st in self.states.values():
            st.length = step.after[st.region.name]
            self.positions[st.region.name] += step.advances[st.region.clock.name]
            st.step = None

    def commit(self, step: StepPlan) -> None:
        self.commit_device(step)
        self.commit_host(step)

    def prepare(self, step: StepPlan) -> None:
        """Create per-signature constants before a capture (no host->device copy during capture)."""
        key = step.signature
        if key not in self._advance_vectors:
            vals = [step.advances[r.clock.name] for r in self.plan.regions] + [1]
            self._advance_vectors[key] = torch.tensor(vals, dtype=torch.int64).to(self.device)

    # -- reporting ---------------------------------------------------------------------------------
    def state_bytes(self) -> int:
        raise NotImplementedError

    def export(self) -> Dict[str, torch.Tensor]:
        """Copies of every region's current contents (for migration between arenas and tests)."""
        return {n: st.get().clone() for n, st in self.states.items()}

    def load(self, contents: Dict[str, torch.Tensor], positions: Dict[str, int], step_index: int) -> None:
        for n, st in self.states.items():
            st.length = contents[n].shape[st.region.axis] if st.region.axis is not None else st.length
            self._load(st, contents[n])
        self.positions = dict(positions)
        self._sync_counters(step_index)

    def snapshot(self) -> Dict[str, torch.Tensor]:
        """Device copies of everything a step may mutate (for warm-up without advancing state)."""
        snap = {n: t.clone() for n, t in self._tensors().items()}
        snap["__counters__"] = self.counters.clone()
        return snap

    def restore(self, snap: Dict[str, torch.Tensor]) -> None:
        for n, t in self._tensors().items():
            t.copy_(snap[n])
        self.counters.copy_(snap["__counters__"])

    def _tensors(self) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    # -- arena-specific ----------------------------------------------------------------------------
    def _view(self, st, length): raise NotImplementedError
    def _grow(self, st): raise NotImplementedError
    def _set(self, st, value): raise NotImplementedError
    def _retain(self, st, step): raise NotImplementedError
    def _load(self, st, value): raise NotImplementedError


class DemandArena(ArenaBase):
    """Every region allocated once at its demand size; views of stable storage; in-place retention."""

    kind = "demand"

    def __init__(self, plan: Plan, device):
        super().__init__(plan, device)
        self.storage: Dict[str, torch.Tensor] = {}
        for r in plan.regions:
            units = plan.demand[r.name]
            self.storage[r.name] = torch.zeros(r.shape_at(units), dtype=r.dtype, device=self.device)

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.storage.values())

    def _tensors(self):
        return self.storage

    def addresses(self) -> Dict[str, int]:
        return {n: t.data_ptr() for n, t in self.storage.items()}

    def _view(self, st, length):
        t = self.storage[st.region.name]
        ax = st.region.axis
        if ax is None:
            return t
        # newest-first regions are right-aligned in their storage, so they grow towards the front
        start = t.shape[ax] - length if st.region.newest_first else 0
        return t.narrow(ax, start, length)

    def _grow(self, st):
        g = st.step.grown[st.region.name] if st.step is not None else st.length
        return self._view(st, g)

    def _set(self, st, value):
        self._view(st, st.length).copy_(value)

    def _retain(self, st, step):
        r = st.region
        grown, after = step.grown[r.name], step.after[r.name]
        if r.axis is None or isinstance(r.retention, (Static, Fixed, Ring, Horizon)) or grown == after:
            return
        prefix = int(self.plan.spec.prefix.get(r.name, 0)) if isinstance(r.retention, PrefixWindow) else 0
        keep = after - prefix
        shift = grown - after            # the kept window moves from [prefix+shift, grown) to [prefix, after)
        t = self.storage[r.name]
        if r.newest_first:
            self._retain_front(t, r.axis, prefix, grown, shift)
            return
        # forward block copies of at most `shift` units: a block's source is never a block already written
        done = 0
        while done < keep:
            n = min(shift, keep - done)
            t.narrow(r.axis, prefix + done, n).copy_(t.narrow(r.axis, prefix + shift + done, n))
            done += n

    @staticmethod
    def _retain_front(t, ax, prefix, grown, shift):
        """Newest-first (right-aligned) region: the kept window already ends the storage; the logical
        prefix ``[0:prefix]`` moves ``shift`` units towards the end, in blocks taken from its back, so
        no block reads units an earlier block wrote."""
        start = t.shape[ax] - grown            # physical index of logical unit 0 of the grown view
        done = 0
        while done < prefix:
            n = min(shift, prefix - done)
            src = start + prefix - done - n
            t.narrow(ax, src + shift, n).copy_(t.narrow(ax, src, n))
            done += n

    def _load(self, st, value):
        if st.region.axis is None:
            self.storage[st.region.name].copy_(value)
        else:
            self._view(st, value.shape[st.region.axis]).copy_(value)


class StockArena(ArenaBase):
    """The stock runtime's way: static buffers at its constants, live state grown/truncated by cat."""

    kind = "stock"

    def __init__(self, plan: Plan, device):
        super().__init__(plan, device)
        self.static: Dict[str, torch.Tensor] = {}
        self.live: Dict[str, torch.Tensor] = {}
        for r in plan.regions:
            shape = r.stock_static_shape()
            if shape is not None:
                # what the stock runtime keeps resident (e.g. a module buffer sized for 1000 frames);
                # nothing reads it, so it is not zero-filled (the allocator reserves it all the same)
                self.static[r.name] = torch.empty(shape, dtype=r.dtype, device=self.device)
            st = self.states[r.name]
            self.live[r.name] = torch.zeros(r.shape_at(st.length), dtype=r.dtype, device=self.device)

    def state_bytes(self) -> int:
        tensors: Iterable[torch.Tensor] = list(self.static.values()) + list(self.live.values())
        return sum(t.numel() * t.element_size() for t in tensors)

    def _tensors(self):
        return self.live

    def _view(self, st, length):
        t = self.live[st.region.name]
        ax = st.region.axis
        return t if ax is None else t.narrow(ax, 0, length)

    def _grow(self, st):
        r = st.region
        g = st.step.grown[r.name] if st.step is not None else st.length
        cur = self.live[r.name]
        if r.axis is None or cur.shape[r.axis] == g:
            return cur
        # stock: torch.cat([cache, new], dim=time) — a fresh tensor every step ([new, cache] if newest first)
        extra = list(cur.shape)
        extra[r.axis] = g - cur.shape[r.axis]
        parts = [cur.new_empty(extra), cur] if r.newest_first else [cur, cur.new_empty(extra)]
        grown = torch.cat(parts, dim=r.axis)
        self.live[r.name] = grown
        return grown

    def _set(self, st, value):
        self.live[st.region.name] = value.clone()

    def _retain(self, st, step):
        r = st.region
        t = self.live[r.name]
        after = step.after[r.name]
        if r.axis is None or t.shape[r.axis] == after:
            return
        if isinstance(r.retention, (PrefixWindow, SlidingWindow)):
            prefix = int(self.plan.spec.prefix.get(r.name, 0)) if isinstance(r.retention, PrefixWindow) else 0
            win = after - prefix
            # stock: cache = torch.cat([cache[..., :P, :], cache[..., -window:, :]], dim=time)
            self.live[r.name] = torch.cat([t.narrow(r.axis, 0, prefix),
                                           t.narrow(r.axis, t.shape[r.axis] - win, win)], dim=r.axis)

    def _load(self, st, value):
        self.live[st.region.name] = value.clone()


def make_arena(kind: str, plan: Plan, device) -> ArenaBase:
    if kind == "demand":
        return DemandArena(plan, device)
    if kind == "stock":
        return StockArena(plan, device)
    raise ValueError(f"unknown arena kind {kind!r} (expected 'demand' or 'stock')")
