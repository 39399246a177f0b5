"""Data-clocked regions: state whose advance the data decides, up to a declared worst case per step.

A planned region (:mod:`.regions`) advances by its clock's pattern, so every step's shape is known ahead.
Some state advances by what the model says: an LLM's key/value history takes 13 positions in a listening
second and up to 33 in a speaking one; a TTS's takes its turn's text and codes. Such a region declares a
:class:`DataClock` — the *worst case* a step may add — and is written through an append handle: a step
writes ``n`` rows at the current length (``append``), then ``commit(n)`` makes them part of the history.
Because the worst case is declared, the room for the next step is known before it starts
(:meth:`GrowingStore.begin_step`), and the planner sizes the region as any other (its clock's pattern is
the worst case).

Two policies keep the rows, both giving the same values at the same positions:

* :class:`StockGrowth` — as the stock runtimes do (HF ``DynamicCache``): each part (a layer) is a fresh
  tensor per append, ``torch.cat([history, rows])``. For bit comparison and the memory plot's baseline.
* :class:`DemandGrowth` — storage preallocated at a capacity (the planner's demand), written in place,
  read through exact-length views at a stable address, so CUDA graphs can replay over it. It grows only
  when a step's declared worst case would not fit (at :meth:`~GrowingStore.begin_step`, never mid-step;
  an append outside a step grows on demand). Growth is a migration: new storage, the history copied,
  ``grown`` bumped — graph owners compare ``grown`` (or the storage address) and capture again.

:func:`switch_policy` moves a store's contents to the other policy bit for bit (the demand toggle flipped
mid-session). A store holds one or more regions sharing one length (keys and values); axis 0 of every
region is its *parts* axis (layers), each part appended on its own.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .regions import Clock, Horizon, Region


@dataclass(frozen=True)
class DataClock(Clock):
    """A clock the data drives: a step advances anywhere from 0 to ``worst`` units, decided while it runs.
    Its pattern is the one worst case, so the planner's demand is the room a session can need."""

    def __post_init__(self):
        super().__post_init__()
        if len(self.pattern) != 1 or int(self.pattern[0]) < 1:
            raise ValueError(f"data clock {self.name!r}: declare one worst case of at least 1 unit per step, "
                             f"got {self.pattern}")

    @property
    def worst(self) -> int:
        return int(self.pattern[0])


def data_clock(name: str, worst: int, rate_hz: float = 0.0) -> DataClock:
    """A data-driven clock adding at most ``worst`` units per step."""
    return DataClock(name, (int(worst),), rate_hz)


class GrowingStore:
    """Regions on one :class:`DataClock`, one shared ``length``; see the module docstring.

    ``length`` is a plain host int: graph owners may set it around a capture and put it back."""

    kind = "abstract"

    def __init__(self, regions: Sequence[Region], device):
        self.regions: Tuple[Region, ...] = tuple(regions)
        self.names = tuple(r.name for r in self.regions)
        self.device = torch.device(device)
        first = self.regions[0] if self.regions else None
        for r in self.regions:
            if not isinstance(r.clock, DataClock):
                raise ValueError(f"region {r.name!r}: a growing store needs a DataClock, got {r.clock!r}")
            if r.axis in (None, 0) or r.clock != first.clock or r.axis != first.axis \
                    or r.shape[0] != first.shape[0]:
                raise ValueError(f"region {r.name!r}: regions of one store share their data clock, a time axis "
                                 f"after axis 0 (the parts axis) and the parts count; got {r.shape} on {r.clock}")
        if first is None:
            raise ValueError("a growing store needs at least one region")
        self.axis, self.parts = int(first.axis), int(first.shape[0])
        self.clock: DataClock = first.clock
        self.length = 0
        self.grown = 0
        self._step: Optional[Tuple[int, int]] = None      # (length at begin, rows allowed) of the open step

    # -- the declared worst case -------------------------------------------------------------------------
    @property
    def worst(self) -> int:
        return self.clock.worst

    @property
    def limit(self) -> Optional[int]:
        """The horizon the regions declare (units), None when unbounded."""
        ret = self.regions[0].retention
        return int(ret.max_units) if isinstance(ret, Horizon) else None

    def begin_step(self, worst: Optional[int] = None, ahead: int = 0) -> Optional[str]:
        """Open a step that adds at most ``worst`` rows (default: the clock's declared worst case). The room
        is made now (a demand store grows here if it must), so nothing in the step moves the storage.

        ``ahead``: also grow now if the room after this step would not hold ``ahead`` more worst-case steps —
        the caller passes it in a step with time to spare (a second after a listening one), so the migration,
        and the graph owners' captures after it, land there rather than in a later step that has none (one
        move covers both). Returns how the storage moved: None (it did not), ``"needed"`` (the step had no
        room) or ``"ahead"``."""
        n = self.worst if worst is None else int(worst)
        if n < 0 or int(ahead) < 0:
            raise ValueError(f"{self.names[0]}: a step's worst case and its steps ahead must be >= 0, "
                             f"got {n} and {ahead}")
        need, room, before = self.length + n, self.room(), self.grown
        if ahead:
            self._grow_ahead(need + int(ahead) * self.worst)
        self.ensure(need)
        self._step = (self.length, n)
        if self.grown == before:
            return None
        return "needed" if room is not None and need > room else "ahead"

    def room(self) -> Optional[int]:
        """Rows the storage holds without moving (None: it grows as it writes)."""
        return None

    def end_step(self) -> None:
        self._step = None

    def _grow_ahead(self, end: int) -> None:
        """Room for ``end`` rows if the policy grows ahead (a demand store within its horizon); never refuses."""
        return None

    @property
    def in_step(self) -> bool:
        return self._step is not None

    @contextlib.contextmanager
    def rehearsal(self) -> Iterator[None]:
        """Writes that rehearse a later step inside the room (a graph captured ahead of time, and its
        warm-up): the open step's bounds are set aside and the length put back after. Never grows: the
        caller stays within :meth:`room`; what it writes lands past the history, where the real step
        writes again before anything reads it."""
        saved = self._step, self.length
        self._step = None
        try:
            yield
        finally:
            self._step, self.length = saved

    def _check_rows(self, end: int, what: str) -> None:
        if self._step is None:
            return
        start, n = self._step
        if end > start + n:
            raise ValueError(f"{self.names[0]}: {what} would hold {end} rows, past this step's declared worst case "
                             f"of {n} rows after {start} (declare a larger worst case, or begin_step(n) for "
                             f"a longer step)")

    # -- the append handle -------------------------------------------------------------------------------
    def append(self, part: int, *rows: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Write ``rows`` (one tensor per region, the region's shape with 1 part and ``t`` units) into part
        ``part`` at the current length; returns each region's part over ``length + t`` units. Not committed:
        every part of a step writes at the same length, then :meth:`commit` advances it."""
        if len(rows) != len(self.regions) or not 0 <= int(part) < self.parts:
            raise ValueError(f"{self.names[0]}: append takes a part in [0, {self.parts}) and one tensor per "
                             f"region {self.names}; got part {part} and {len(rows)} tensors")
        t = int(rows[0].shape[self.axis]) if rows[0].dim() > self.axis else -1
        for r, x in zip(self.regions, rows):
            want = (1,) + r.shape_at(t)[1:]
            if tuple(x.shape) != want or x.dtype != r.dtype:
                raise ValueError(f"{r.name}: append wants rows of shape {want} and {r.dtype}, got "
                                 f"{tuple(x.shape)} and {x.dtype}")
        end = self.length + t
        self._check_rows(end, f"appending {t} rows at {self.length}")
        if self._step is None:
            self.ensure(end)                                  # outside a step: grow on demand
        return self._write(int(part), rows, end)

    def commit(self, n: int) -> None:
        """The ``n`` rows every part appended are now history."""
        self._check_rows(self.length + int(n), f"committing {n} rows at {self.length}")
        self.length += int(n)

    def reset(self) -> None:
        """Drop the history (a turn's end); an open step keeps the rows it has left."""
        if self._step is not None:
            start, n = self._step
            self._step = (0, max(0, start + n - self.length))
        self.length = 0
        self._clear()

    # -- contents ------------------------------------------------------------------------------------------
    def contents(self) -> Dict[str, torch.Tensor]:
        """Copies of the history: every region at its full shape over ``length`` units."""
        return {r.name: self._whole(r, self.length) for r in self.regions}

    def load_contents(self, contents: Dict[str, torch.Tensor]) -> None:
        n = int(contents[self.names[0]].shape[self.axis])
        for r in self.regions:
            x = contents[r.name]
            if tuple(x.shape) != r.shape_at(n):
                raise ValueError(f"{r.name}: contents of shape {r.shape_at(n)} wanted, got {tuple(x.shape)}")
        self.ensure(n)
        self._load(contents, n)
        self.length = n

    # -- policy-specific -----------------------------------------------------------------------------------
    def ensure(self, end: int) -> None:
        """Room for ``end`` rows."""
        raise NotImplementedError

    def state_bytes(self) -> int:
        raise NotImplementedError

    def _write(self, part, rows, end): raise NotImplementedError
    def _whole(self, region, n): raise NotImplementedError
    def _load(self, contents, n): raise NotImplementedError
    def _clear(self): raise NotImplementedError


class StockGrowth(GrowingStore):
    """The stock runtime's way: per part a fresh ``torch.cat([history, rows])`` every append, unbounded."""

    kind = "stock"

    def __init__(self, regions: Sequence[Region], device):
        super().__init__(regions, device)
        self.parts_of: Dict[str, List[Optional[torch.Tensor]]] = {}
        self._clear()

    def ensure(self, end: int) -> None:
        return None                                          # the stock grows as it writes

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self.parts_of.values() for t in ts if t is not None)

    def _write(self, part, rows, end):
        out = []
        for r, x in zip(self.regions, rows):
            ts = self.parts_of[r.name]
            ts[part] = x if ts[part] is None else torch.cat([ts[part], x], dim=self.axis)
            out.append(ts[part])
        return tuple(out)

    def _whole(self, region, n):
        ts = self.parts_of[region.name]
        if n == 0:
            return torch.zeros(region.shape_at(0), dtype=region.dtype, device=self.device)
        return torch.cat([t.narrow(self.axis, 0, n) for t in ts], dim=0)

    def _load(self, contents, n):
        for r in self.regions:
            x = contents[r.name].to(self.device)
            self.parts_of[r.name] = [x[i:i + 1].clone() if n else None for i in range(self.parts)]

    def _clear(self):
        self.parts_of = {r.name: [None] * self.parts for r in self.regions}


class DemandGrowth(GrowingStore):
    """Preallocated at ``capacity`` units, in-place writes, exact-length views at a stable address.

    ``growable``: past its capacity the store migrates to ``max(2 x capacity, needed)`` units (up to the
    regions' :class:`~.regions.Horizon`), one copy, ``grown`` + 1; otherwise it refuses in one line."""

    kind = "demand"
    #: units allocated past ``capacity`` that no history ever reaches (a subclass's scratch: the MiniCPM-o LLM
    #: store's sink for a group step's absent rows); set before this class's ``__init__`` allocates
    spare = 0

    def __init__(self, regions: Sequence[Region], device, capacity: int, growable: bool = False):
        super().__init__(regions, device)
        if int(capacity) < 0:
            raise ValueError(f"{self.names[0]}: capacity must be >= 0, got {capacity}")
        self.capacity = int(capacity)
        self.growable = bool(growable)
        self.storage: Dict[str, torch.Tensor] = {
            r.name: torch.zeros(r.shape_at(self.capacity + self.spare), dtype=r.dtype, device=self.device)
            for r in self.regions}

    def room(self) -> Optional[int]:
        return self.capacity

    def addresses(self) -> Dict[str, int]:
        return {n: t.data_ptr() for n, t in self.storage.items()}

    def ensure(self, end: int) -> None:
        if end <= self.capacity:
            return
        limit = self.limit
        if not self.growable or (limit is not None and end > limit):
            bound = limit if self.growable else self.capacity
            raise RuntimeError(f"{self.names[0]}: {end} positions exceed the horizon of {bound} "
                               f"(start a new session)")
        cap = max(2 * self.capacity, end)
        self._move(cap if limit is None else min(limit, cap))

    def _grow_ahead(self, end: int) -> None:
        limit = self.limit
        if end <= self.capacity or not self.growable or (limit is not None and self.capacity >= limit):
            return
        cap = max(2 * self.capacity, end)
        self._move(cap if limit is None else min(limit, cap))

    def _move(self, cap: int) -> None:
        """Growth as a migration: new storage of ``cap`` units, the history copied, ``grown`` bumped."""
        for r in self.regions:
            old = self.storage[r.name]
            new = torch.zeros(r.shape_at(cap + self.spare), dtype=r.dtype, device=old.device)
            new.narrow(self.axis, 0, self.length).copy_(old.narrow(self.axis, 0, self.length))
            self.storage[r.name] = new
        self.capacity = cap
        self.grown += 1

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.storage.values())

    def view(self, name: str, n: Optional[int] = None) -> torch.Tensor:
        """Region ``name`` over its first ``n`` units (default ``length``): a view of the storage."""
        return self.storage[name].narrow(self.axis, 0, self.length if n is None else int(n))

    def _write(self, part, rows, end):
        out = []
        for r, x in zip(self.regions, rows):
            t = self.storage[r.name].narrow(0, part, 1)
            t.narrow(self.axis, self.length, end - self.length).copy_(x)
            out.append(t.narrow(self.axis, 0, end))
        return tuple(out)

    def _whole(self, region, n):
        return self.view(region.name, n).clone()

    def _load(self, contents, n):
        for r in self.regions:
            self.view(r.name, n).copy_(contents[r.name])

    def _clear(self):
        return None                                          # the storage stays; length 0 hides it


def make_growing(kind: str, regions: Sequence[Region], device, capacity: int = 0,
                 growable: bool = False) -> GrowingStore:
    if kind == "demand":
        return DemandGrowth(regions, device, capacity, growable)
    if kind == "stock":
        return StockGrowth(regions, device)
    raise ValueError(f"unknown growth policy {kind!r} (expected 'demand' or 'stock')")


def move_contents(src: GrowingStore, dst: GrowingStore) -> GrowingStore:
    """``dst`` takes ``src``'s history (bit for bit) and its open step, with the step's room; returns ``dst``."""
    if src.names != dst.names:
        raise ValueError(f"cannot move regions {src.names} into a store of {dst.names}")
    dst.load_contents({n: t.to(dst.device) for n, t in src.contents().items()})
    if src._step is not None:                            # the open step's room moves with it
        start, n = src._step
        dst.ensure(start + n)
        dst._step = src._step
    return dst


def switch_policy(store: GrowingStore, kind: str, capacity: int = 0, growable: bool = False) -> GrowingStore:
    """The same history under policy ``kind`` (the store itself when it already is)."""
    if store.kind == kind:
        return store
    return move_contents(store, make_growing(kind, store.regions, store.device, capacity, growable))
