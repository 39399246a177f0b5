"""Clocks, retention policies and state-region declarations.

A streaming model declares each piece of state it carries from one step to the next as a
:class:`Region`: its full shape with one *time axis* (``None`` in ``shape``), its dtype, the
:class:`Clock` that advances it, and a :class:`Retention` policy that says how many units it keeps.
From those declarations alone the planner derives every step's exact shapes ahead of time.

Units are whatever the region counts along its time axis (mel frames, samples, 25 Hz transformer
steps...). A clock says how many units a step appends; the retention says what survives the step.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch


@dataclass(frozen=True)
class Clock:
    """How far a region advances per step, in its own units.

    ``pattern`` is periodic: step ``k`` advances ``pattern[k % len(pattern)]`` units. A 1 s step of
    50 Hz mel is ``Clock("mel", (50,))``; Mimi's 12.5 Hz frames in whole seconds alternate
    ``(12, 13)``-frame seconds, and its 25 Hz transformer clock ``(24, 26)``.
    ``rate_hz`` is informational (units per second of audio) and used for reporting.
    """

    name: str
    pattern: Tuple[int, ...]
    rate_hz: float = 0.0

    def __post_init__(self):
        if not self.pattern or any(int(p) < 0 for p in self.pattern):
            raise ValueError(f"clock {self.name!r}: pattern must be non-empty and non-negative, got {self.pattern}")

    def advance(self, step: int) -> int:
        return int(self.pattern[step % len(self.pattern)])

    @property
    def period(self) -> int:
        return len(self.pattern)


#: A clock that never advances (state replaced in place every step).
STILL = Clock("still", (0,))


class Retention:
    """What a region keeps after a step. Subclasses name the policy (cf. transformers' cache layers)."""

    kind = "abstract"

    def initial(self, prefix: int) -> int:
        """Length before the first step, given the session's prefix (prompt) length for this region."""
        return prefix

    def after(self, grown: int, prefix: int) -> int:
        """Length kept after a step whose working view had ``grown`` units."""
        raise NotImplementedError

    def grows(self) -> bool:
        """Whether a step's working view is ``before + advance`` (True) or stays at ``before``."""
        return True

    def describe(self) -> str:
        return self.kind


@dataclass(frozen=True)
class Fixed(Retention):
    """Constant length, replaced every step (conv lookback, lookahead, cross-fade tails)."""

    length: int
    kind = "fixed"

    def initial(self, prefix: int) -> int:
        return self.length

    def after(self, grown: int, prefix: int) -> int:
        return self.length

    def grows(self) -> bool:
        return False

    def describe(self) -> str:
        return f"fixed {self.length}"


@dataclass(frozen=True)
class Static(Retention):
    """State with no time axis, replaced in place every step (conv weights folded per session, a
    speaker condition, a whole fixed-shape cache): its shape is the region's shape, nothing grows."""

    kind = "static"

    def initial(self, prefix: int) -> int:
        return 0

    def after(self, grown: int, prefix: int) -> int:
        return 0

    def grows(self) -> bool:
        return False

    def describe(self) -> str:
        return "static"


@dataclass(frozen=True)
class SlidingWindow(Retention):
    """Keeps the last ``window`` units (no prompt prefix)."""

    window: int
    kind = "window"

    def initial(self, prefix: int) -> int:
        return min(prefix, self.window)

    def after(self, grown: int, prefix: int) -> int:
        return min(grown, self.window)

    def describe(self) -> str:
        return f"window {self.window}"


@dataclass(frozen=True)
class PrefixWindow(Retention):
    """Keeps the session prefix (the voice prompt) plus the last ``window`` units after it.

    Step-Audio2 keeps the prompt's frames and the last 100 generated ones: after a step whose view
    had ``grown`` units the region holds ``prefix + min(window, grown - prefix)``.
    """

    window: int
    kind = "prefix+window"

    def after(self, grown: int, prefix: int) -> int:
        return prefix + min(self.window, grown - prefix)

    def describe(self) -> str:
        return f"prefix + window {self.window}"


@dataclass(frozen=True)
class Ring(Retention):
    """A ring buffer of constant ``capacity``: writes land at ``position % capacity``.

    The view is the whole ring every step (the model masks positions not yet written), so the shape
    never changes; the write offset is a device-side counter, never a Python int baked into a graph.
    """

    capacity: int
    kind = "ring"

    def initial(self, prefix: int) -> int:
        return self.capacity

    def after(self, grown: int, prefix: int) -> int:
        return self.capacity

    def grows(self) -> bool:
        return False

    def describe(self) -> str:
        return f"ring {self.capacity}"


@dataclass(frozen=True)
class Horizon(Retention):
    """Keeps everything up to a session horizon (e.g. flow noise for the whole session)."""

    max_units: int
    kind = "horizon"

    def after(self, grown: int, prefix: int) -> int:
        if grown > self.max_units:
            raise ValueError(f"session runs past its horizon of {self.max_units} units")
        return grown

    def describe(self) -> str:
        return f"horizon {self.max_units}"


@dataclass(frozen=True)
class Region:
    """One piece of streaming state.

    ``shape`` is the full tensor shape with ``None`` at the time axis (or no ``None`` for a region
    with no time axis, which then is :class:`Static` or a :class:`Ring`).
    ``stock_units`` is what the stock runtime sizes the time axis at (its static constant), so the
    planner can print stock bytes next to demand bytes; ``stock_note`` says how stock keeps it.
    ``stock_shape``: the stock's static buffer shape when it differs beyond the time axis (Step-Audio2's
    estimator cache is a (16, 16, 2, 8, 1000, 128) buffer whatever the model's step count and depth).
    ``newest_first``: a step's new units go to the *front* of the time axis (the region reads
    newest -> oldest, as Step-Audio2's DiT cache ``cat([new, cache])`` does); retention keeps the
    same logical units ``[0:prefix]`` and the last window, so lengths and plans are unchanged.
    """

    name: str
    shape: Tuple[Optional[int], ...]
    clock: Clock
    retention: Retention
    dtype: torch.dtype = torch.float32
    stock_units: Optional[int] = None
    stock_note: str = ""
    doc: str = ""
    newest_first: bool = False
    stock_shape: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        n_none = sum(1 for s in self.shape if s is None)
        if n_none > 1:
            raise ValueError(f"region {self.name!r}: at most one time axis (None) in shape {self.shape}")
        if n_none == 0 and not isinstance(self.retention, (Static, Fixed, Ring)):
            raise ValueError(f"region {self.name!r}: a {self.retention.kind} region needs a time axis")
        if n_none == 1 and isinstance(self.retention, Static):
            raise ValueError(f"region {self.name!r}: a static region has no time axis (no None in its shape)")

    def under(self, prefix: str) -> "Region":
        """This region declared by a sub-module mounted at ``prefix`` (its name becomes ``prefix.name``)."""
        return dataclasses.replace(self, name=f"{prefix}.{self.name}" if prefix else self.name)

    @property
    def axis(self) -> Optional[int]:
        for i, s in enumerate(self.shape):
            if s is None:
                return i
        return None

    def shape_at(self, units: int) -> Tuple[int, ...]:
        """Concrete shape when the time axis holds ``units``."""
        return tuple(int(units) if s is None else int(s) for s in self.shape)

    def stock_static_shape(self) -> Optional[Tuple[int, ...]]:
        """Full shape of the stock runtime's static buffer for this region, if it keeps one."""
        if self.stock_shape is not None:
            return tuple(int(x) for x in self.stock_shape)
        if self.stock_units is not None:
            return self.shape_at(self.stock_units)
        return None

    def bytes_at(self, units: int) -> int:
        n = 1
        for s in self.shape_at(units):
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


def prefixed(prefix: str, regions: Sequence[Region]) -> List[Region]:
    """A reusable block's regions (declared under its own short names) mounted at ``prefix``."""
    return [r.under(prefix) for r in regions]


def region_names(regions: Sequence[Region]) -> Tuple[str, ...]:
    names = tuple(r.name for r in regions)
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate region names: {names}")
    return names


@dataclass(frozen=True)
class SessionSpec:
    """What the planner needs to know about one streaming session.

    ``steps``: number of steps (None = open-ended live session: the plan covers enough steps for the
    shapes to settle, and the steady signature repeats forever).
    ``prefix``: units each region holds before the first step (the voice prompt), by region name.
    ``last_advance``: overrides of the final step's advance by clock name (a last, partial chunk).
    """

    steps: Optional[int] = None
    prefix: dict = field(default_factory=dict)
    last_advance: dict = field(default_factory=dict)
    label: str = ""
