"""The planner: from clock and retention declarations to every step's exact shapes.

Nothing here touches a GPU. Given a model's regions and a :class:`SessionSpec`, :func:`make_plan`
simulates the lengths of every region before, during (the *grown* working view) and after each
step, groups steps by their **shape signature** (the tuple of clock advances and region lengths
that fixes every tensor shape of the step), and computes each region's **demand size**: the largest
view any step needs. Retention caps make the sequence settle, so an open-ended live session has a
finite set of signatures and a periodic steady state, which :meth:`Plan.step` extends forever.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .regions import Clock, Region, SessionSpec, region_names

MAX_SIM_STEPS = 100_000


@dataclass(frozen=True)
class ShapeSignature:
    """Everything that fixes the shapes of one step: one CUDA graph is captured per signature."""

    advances: Tuple[Tuple[str, int], ...]          # (clock name, units this step)
    lengths: Tuple[Tuple[str, int, int], ...]      # (region name, units before, units in working view)

    @property
    def label(self) -> str:
        adv = ",".join(f"{c}+{n}" for c, n in self.advances)
        return f"[{adv}] " + " ".join(f"{r}:{b}->{g}" for r, b, g in self.lengths)


@dataclass(frozen=True)
class StepPlan:
    index: int
    advances: Dict[str, int]
    before: Dict[str, int]
    grown: Dict[str, int]
    after: Dict[str, int]
    signature: ShapeSignature
    is_last: bool = False


@dataclass
class Plan:
    """The whole timeline of one session, its signatures and its demand sizes."""

    regions: Tuple[Region, ...]
    spec: SessionSpec
    timeline: List[StepPlan]
    demand: Dict[str, int]
    settled_at: Optional[int]      # first step of the periodic steady state (open-ended sessions)
    period: int

    @property
    def signatures(self) -> List[ShapeSignature]:
        seen: Dict[ShapeSignature, None] = {}
        for s in self.timeline:
            seen.setdefault(s.signature, None)
        return list(seen)

    @property
    def finite(self) -> bool:
        return self.spec.steps is not None

    def step(self, k: int) -> StepPlan:
        """The plan of step ``k``; open-ended sessions repeat their steady period forever."""
        if k < 0:
            raise IndexError(k)
        if k < len(self.timeline):
            return self.timeline[k]
        if self.finite:
            raise IndexError(f"step {k} is past the session's {self.spec.steps} steps")
        base = self.settled_at + (k - self.settled_at) % self.period
        s = self.timeline[base]
        return StepPlan(k, s.advances, s.before, s.grown, s.after, s.signature, False)

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    def demand_bytes(self) -> Dict[str, int]:
        return {r.name: r.bytes_at(self.demand[r.name]) for r in self.regions}

    def stock_bytes(self) -> Dict[str, int]:
        out = {}
        for r in self.regions:
            shape = r.stock_static_shape()
            if shape is None:
                out[r.name] = r.bytes_at(self.demand[r.name])
            else:
                n = 1
                for x in shape:
                    n *= x
                out[r.name] = n * torch.empty((), dtype=r.dtype).element_size()
        return out


def _lcm(values: Sequence[int]) -> int:
    return reduce(lambda a, b: a * b // math.gcd(a, b), values, 1)


def _advance(clock: Clock, k: int, spec: SessionSpec) -> int:
    if spec.steps is not None and k == spec.steps - 1 and clock.name in spec.last_advance:
        return int(spec.last_advance[clock.name])
    return clock.advance(k)


def _simulate_step(regions, lengths, k, spec) -> StepPlan:
    clocks = {}
    for r in regions:
        clocks.setdefault(r.clock.name, _advance(r.clock, k, spec))
    before, grown, after = {}, {}, {}
    for r in regions:
        pre = spec.prefix.get(r.name, 0)
        adv = clocks[r.clock.name]
        before[r.name] = lengths[r.name]
        grown[r.name] = lengths[r.name] + adv if r.retention.grows() else lengths[r.name]
        after[r.name] = r.retention.after(grown[r.name], pre)
    sig = ShapeSignature(
        advances=tuple(sorted(clocks.items())),
        lengths=tuple((r.name, before[r.name], grown[r.name]) for r in regions),
    )
    last = spec.steps is not None and k == spec.steps - 1
    return StepPlan(k, dict(clocks), before, grown, after, sig, last)


def make_plan(regions: Sequence[Region], spec: SessionSpec) -> Plan:
    """Derive the exact per-step shapes, the signatures and the demand sizes of a session."""
    regions = tuple(regions)
    region_names(regions)
    unknown = set(spec.prefix) - {r.name for r in regions}
    if unknown:
        raise ValueError(f"session prefix names unknown regions: {sorted(unknown)}")
    lengths = {r.name: r.retention.initial(int(spec.prefix.get(r.name, 0))) for r in regions}
    demand = dict(lengths)
    timeline: List[StepPlan] = []
    period = _lcm([r.clock.period for r in regions] or [1])
    history: Dict[Tuple, int] = {}
    settled_at = None
    n_steps = spec.steps if spec.steps is not None else MAX_SIM_STEPS
    for k in range(n_steps):
        if spec.steps is None:
            key = (k % period, tuple(sorted(lengths.items())))
            if key in history:
                settled_at = history[key]
                period = k - settled_at
                break
            history[key] = k
        s = _simulate_step(regions, lengths, k, spec)
        timeline.append(s)
        for r in regions:
            demand[r.name] = max(demand[r.name], s.before[r.name], s.grown[r.name], s.after[r.name])
        lengths = dict(s.after)
    else:
        if spec.steps is None:
            raise ValueError("an open-ended session never settles: a region grows without a retention cap "
                             "(give the session a number of steps or the region a window)")
    return Plan(regions, spec, timeline, demand, settled_at, period)


def format_plan(plan: Plan, max_rows: int = 12) -> str:
    """Human-readable timeline, signatures and bytes per region (demand vs stock)."""
    lines = []
    label = plan.spec.label or "session"
    steps = plan.spec.steps if plan.finite else f"open-ended (settles at step {plan.settled_at}, period {plan.period})"
    lines.append(f"plan for {label}: steps={steps}")
    lines.append("")
    lines.append("regions:")
    db, sb = plan.demand_bytes(), plan.stock_bytes()
    w = max(len(r.name) for r in plan.regions) if plan.regions else 4
    lines.append(f"  {'name':<{w}}  {'clock':<14} {'retention':<22} {'demand shape':<34} {'demand':>10} {'stock':>10}  stock sizing")
    for r in plan.regions:
        clk = f"{r.clock.name} {'/'.join(map(str, r.clock.pattern))}"
        shape = str(r.shape_at(plan.demand[r.name]))
        lines.append(f"  {r.name:<{w}}  {clk:<14} {r.retention.describe():<22} {shape:<34} "
                     f"{_fmt_bytes(db[r.name]):>10} {_fmt_bytes(sb[r.name]):>10}  {r.stock_note}")
    td, ts = sum(db.values()), sum(sb.values())
    saved = f" ({100 * (1 - td / ts):.1f}% less)" if ts else ""
    lines.append(f"  {'total':<{w}}  {'':<14} {'':<22} {'':<34} {_fmt_bytes(td):>10} {_fmt_bytes(ts):>10}{saved}")
    lines.append("")
    lines.append("timeline (units before -> working view -> after):")
    shown = plan.timeline[:max_rows]
    for s in shown:
        cells = " ".join(f"{n}:{s.before[n]}->{s.grown[n]}->{s.after[n]}" for n in s.before)
        sig = plan.signatures.index(s.signature)
        lines.append(f"  step {s.index:>4}  sig#{sig}  {cells}{'  (last)' if s.is_last else ''}")
    if len(plan.timeline) > len(shown):
        lines.append(f"  ... {len(plan.timeline) - len(shown)} more steps")
    lines.append("")
    lines.append(f"shape signatures: {len(plan.signatures)} (one CUDA graph each, no padding)")
    for i, sig in enumerate(plan.signatures):
        n = sum(1 for s in plan.timeline if s.signature == sig)
        lines.append(f"  sig#{i}: {n} step(s) in the timeline  {sig.label}")
    return "\n".join(lines)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return str(n)
