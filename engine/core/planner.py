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


def simulate_step(regions, lengths, k, spec) -> StepPlan:
    """Step ``k``'s plan from the lengths the steps before it left (``lengths``: region -> length; the plan's
    ``after`` is what it leaves): the planner's one-step rule, public for plans declared step by step
    (``engine.tail.DeclaredPlan``)."""
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
        s = simulate_step(regions, lengths, k, spec)
        timeline.append(s)
        for r in regions:
            demand[r.name] = max(demand[r.name], s.before[r.name], s.grown[r.name], s.after[r.name])
        lengths = dict(s.after)
    else:
        if spec.steps is None:
            raise ValueError("an open-ended session never settles: a region grows without a retention cap "
                             "(give the session a number of steps or the region a window)")
    return Plan(regions, spec, timeline, demand, settled_at, period)


def _names(names: List[str]) -> str:
    """``tr.kv0, tr.kv1, tr.kv2, x`` -> ``tr.kv0-2, x`` (runs of consecutive numbered names shortened)."""
    out: List[str] = []
    run: List[Tuple[str, int]] = []

    def flush() -> None:
        if len(run) > 2:
            out.append(f"{run[0][0]}{run[0][1]}-{run[-1][1]}")
        else:
            out.extend(f"{p}{i}" for p, i in run)
        run.clear()
    for name in names:
        stem = name.rstrip("0123456789")
        if stem != name and run and run[-1][0] == stem and run[-1][1] + 1 == int(name[len(stem):]):
            run.append((stem, int(name[len(stem):])))
            continue
        flush()
        if stem != name:
            run.append((stem, int(name[len(stem):])))
        else:
            out.append(name)
    flush()
    return ", ".join(out)


def _grouped(items: List[Tuple[str, str]]) -> str:
    """``[(region, text)]`` -> one line per distinct text, naming the regions that share it."""
    by_text: Dict[str, List[str]] = {}
    for name, text in items:
        by_text.setdefault(text, []).append(name)
    return "\n".join(f"{text}  {_names(names)}" for text, names in by_text.items())


def format_plan(plan: Plan, max_rows: int = 12) -> str:
    """Human-readable regions (demand vs stock bytes), timeline and signatures, aligned tables that fit
    120 columns: regions whose lengths move alike share one line (``250->250->250  tr.kv0-7``)."""
    import textwrap

    from engine.stats import format_bytes, table
    label = plan.spec.label or "session"
    steps = plan.spec.steps if plan.finite else f"open-ended (settles at step {plan.settled_at}, period {plan.period})"
    lines = [f"plan for {label}: steps={steps}", "", "regions:"]
    db, sb = plan.demand_bytes(), plan.stock_bytes()
    rows = [[r.name, f"{r.clock.name} {'/'.join(map(str, r.clock.pattern))}", r.retention.describe(),
             str(r.shape_at(plan.demand[r.name])), format_bytes(db[r.name]), format_bytes(sb[r.name])]
            for r in plan.regions]
    td, ts = sum(db.values()), sum(sb.values())
    rows.append(["total", "", "", "", format_bytes(td), format_bytes(ts)])
    lines.append(table(rows, ["name", "clock", "retention", "demand shape", "demand", "stock"],
                       max_widths=[24, 20, 22, 22, 10, 10]))
    if ts:
        lines.append(f"demand-sized: {100 * (1 - td / ts):.1f}% less than stock-sized")
    notes: Dict[str, List[str]] = {}
    for r in plan.regions:
        if r.stock_note:
            notes.setdefault(r.stock_note, []).append(r.name)
    if notes:
        lines.append("stock sizing:")
        lines += [textwrap.fill(f"{_names(names)}: {note}", 120, initial_indent="  ", subsequent_indent="    ")
                  for note, names in notes.items()]
    lines += ["", "timeline (units before -> working view -> after):"]
    shown = plan.timeline[:max_rows]
    rows = [[s.index, f"sig#{plan.signatures.index(s.signature)}" + (" (last)" if s.is_last else ""),
             _grouped([(n, f"{s.before[n]}->{s.grown[n]}->{s.after[n]}") for n in s.before])] for s in shown]
    lines.append(table(rows, ["step", "signature", "regions"], max_widths=[None, None, 86]))
    if len(plan.timeline) > len(shown):
        lines.append(f"... {len(plan.timeline) - len(shown)} more steps")
    lines += ["", f"shape signatures: {len(plan.signatures)} (one CUDA graph each, no padding)"]
    rows = []
    for i, sig in enumerate(plan.signatures):
        n = sum(1 for s in plan.timeline if s.signature == sig)
        adv = ", ".join(f"{c}+{k}" for c, k in sig.advances)
        lens = _grouped([(r, f"{b}->{g}") for r, b, g in sig.lengths])
        rows.append([f"sig#{i}", n, adv, lens])
    lines.append(table(rows, ["signature", "steps", "clocks advance", "regions (before -> working view)"],
                       max_widths=[None, None, 30, 64]))
    return "\n".join(lines)
