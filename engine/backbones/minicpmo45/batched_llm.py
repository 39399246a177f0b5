"""The one-token LLM forward of every session over one LLM, as one step: what a device's scheduler batches.

Each session's decode steps (and LISTEN's ``<unit>`` feed) are one-token forwards of the same Qwen3 over its own
history. The scheduler (:mod:`engine.host.scheduler`) parks every session that reaches one and hands this runner
all of them at once; the runner gives each session a *seat* (a row of the group step, kept while the session
stays), and runs :class:`~.group_graphs.GroupGraphs` over every seat — the linears over all rows where the
device proved the row count keeps each row's bits (else in chunks of a proven count), attention per present
session over exactly its own history, the lm_head per present row — each session's key and value written into
its own store at its own length, absent seats' into their stores' sinks. One present session runs its own step
(its layer graphs: the same bits, and nothing read for empty rows).

Seats come in groups of a power of two (2, 4, ..., :data:`MOST_SEATS`), so the graphs are captured again only when
the seated sessions change (a session's first step, its leaving, a store that moved), not when who is present
changes; free seats hold a spare store of one position and a sink. Before a group of a size is used, the device
checks it (:func:`~.group_graphs.check`: the whole step against each session's own forward on fresh histories,
members absent too, every output and every byte of every store); a size the check refuses runs every session's
own step.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from engine.core import yieldpoints

from .group_graphs import GroupGraphs, Verdicts, check, check_rows
from .kv import DemandKV, make_store

#: the step kind a MiniCPM-o backbone hands the scheduler (its one-token LLM forwards; its entry declares it)
LLM_STEP = "llm"
MOST_SEATS = 32


def seats_for(n: int) -> int:
    """The group size that seats ``n`` sessions: the next power of two (at least 2, at most MOST_SEATS)."""
    size = 2
    while size < n and size < MOST_SEATS:
        size *= 2
    return size


class LLMStepBatch:
    """The batched one-token forward of every session over ``llm`` (the scheduler's runner for :data:`LLM_STEP`)."""

    def __init__(self, llm, device):
        self.llm = llm
        self.device = torch.device(device)
        self.verdicts: Optional[Verdicts] = None
        self.checked: Dict[int, Tuple[bool, str]] = {}
        self.seats: List[Optional[object]] = []          # backbone per seat (None: free)
        self.graphs: Optional[GroupGraphs] = None
        self._spares: Dict[int, DemandKV] = {}           # free seat -> its spare store
        self.own_steps = 0
        self.group_steps = 0

    # -- checks (a build's time, in its slices) ----------------------------------------------------------------
    def prepare(self, member) -> None:
        """The row verdicts and every group size's check, made once per LLM (each between two slices of the
        build that asks, so running sessions' seconds go on beside it)."""
        if self.verdicts is None:
            self.verdicts = check_rows(self.llm, range(1, MOST_SEATS + 1))
        size = 2
        while size <= MOST_SEATS:
            yieldpoints.slice_point()
            self._check(size, member)
            size *= 2

    def _check(self, size: int, member) -> Tuple[bool, str]:
        if size not in self.checked:
            region, layers = member.kv_llm.region, member.kv_llm.layers
            room = 16 + 5 * size                     # the check's longest history, and its new position
            fresh = lambda: make_store(True, region, layers, room, self.device, sink=True)     # noqa: E731
            graphs = self.device.type == "cuda"
            # each session's own step run eagerly (its graphs replay the same kernels): one capture, not size + 1
            self.checked[size] = check(self.llm, fresh, self.device, size, self.verdicts, graphs,
                                       absent=[size - 1], own_graphs=False)
        return self.checked[size]

    # -- the step ------------------------------------------------------------------------------------------
    def run(self, members: Sequence[object], embeds: Sequence[torch.Tensor]) -> List[tuple]:
        """Each member's one-token forward of its ``embeds`` row [1, hidden] -> its (hidden [1, hidden],
        logits [1, V]), as its own step would give them."""
        if len(members) == 1 or not all(m.can_join_group() for m in members):
            return self._alone(members, embeds)
        for m in members:
            self._seat(m)
        size = seats_for(len(self.seats))
        if len(self.seats) > MOST_SEATS or not self._check(size, members[0])[0]:
            return self._alone(members, embeds)
        graphs = self._graphs(size)
        at = {id(m): i for i, m in enumerate(self.seats) if m is not None}
        out = graphs.step({at[id(m)]: e for m, e in zip(members, embeds)})
        self.group_steps += 1
        return [out[at[id(m)]] for m in members]

    def _alone(self, members, embeds) -> List[tuple]:
        self.own_steps += len(members)
        return [m.own_forward(e) for m, e in zip(members, embeds)]

    def _seat(self, member) -> None:
        if any(m is member for m in self.seats):
            return
        free = next((i for i, m in enumerate(self.seats) if m is None), None)
        if free is None:
            self.seats.append(member)
        else:
            self.seats[free] = member
            self._spares.pop(free, None)
        self.graphs = None

    def leave(self, member) -> None:
        """``member`` leaves its seat (the session closed or left the host)."""
        for i, m in enumerate(self.seats):
            if m is member:
                self.seats[i] = None
                self.graphs = None
        while self.seats and self.seats[-1] is None:
            self.seats.pop()
            self._spares.pop(len(self.seats), None)

    def _stores(self, size: int) -> List[DemandKV]:
        stores = []
        for i in range(size):
            m = self.seats[i] if i < len(self.seats) else None
            stores.append(m.kv_llm if m is not None else self._spare(i))
        return stores

    def _spare(self, seat: int) -> DemandKV:
        if seat not in self._spares:
            kv = next(m for m in self.seats if m is not None).kv_llm
            self._spares[seat] = make_store(True, kv.region, kv.layers, 1, self.device, sink=True)
        return self._spares[seat]

    def _graphs(self, size: int) -> GroupGraphs:
        """The group's graphs over its seats' stores as they are now (captured again after any change)."""
        stores = self._stores(size)
        if self.graphs is None or not self.graphs.valid_for(stores):
            self.graphs = None
            self.graphs = GroupGraphs(self.llm, stores, self.device, self.verdicts,
                                      capture=self.device.type == "cuda")
        return self.graphs

    def report(self) -> Dict[str, object]:
        return {"seats": sum(m is not None for m in self.seats), "group_steps": self.group_steps,
                "own_steps": self.own_steps,
                "checked": {str(k): {"ok": v[0], "why": v[1]} for k, v in sorted(self.checked.items())}}
