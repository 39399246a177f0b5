"""One-token LLM steps of several hosted MiniCPM-o sessions, met in rounds (issue 24; docs/design-cross-session-llm.md).

Sessions of one set of shared weights join an :class:`LLMRounds` (up to its slots) with their LLM stores (each with
a sink: :class:`~.kv.DemandKV`). A member's one-token forward (a THINK slot, or a single-token feed) joins the open
*round* with its embedding row. A member marks itself *decoding* while THINK draws its unit's slots; the round
fires when every decoding member has joined — the last to join leads — or ``wait_s`` after its first join (the
first to notice leads). The leader runs one :class:`~.group_graphs.GroupGraphs` step over all members' rows, the
absent ones' rows writing to their stores' sinks (so a member feeding LISTEN on its own stream meanwhile is never
raced), then hands each present member its (hidden, logits). A round of one member runs that member's own step.

Each member's results carry its own bits: the group's size is admitted only where ``check(size)`` (on the device,
:func:`.group_graphs.check` with members present and absent) passed; a size refused, a member not in a shared second
(``allow``), or a failed round runs each member's own step, the reference. On CUDA a member records an event after
its embedding on its own stream, the leader's stream waits on every present member's event, runs the step, and
records one event that each member's stream waits on before it reads its row; the next round's leader (maybe on
another stream) waits on it too before it writes the group's buffers.

Moves. A member's store may grow on the member's own thread while another member leads a step that writes it (the
absent rows go to its sink). Its migration therefore runs under the rounds' step lock with the last round's work
done on the device (:meth:`LLMRounds._moving`, set as the store's ``move_guard``), so the old storage is never let
go under a step in flight; the leader sees the moved store (``valid_for``) and captures again. A capture takes the
process's capture lock before the step lock, the one order every taker keeps.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

from engine.core.gate import GATE

from .group_graphs import GroupGraphs, Verdicts

Result = Tuple[torch.Tensor, torch.Tensor]           # (final hidden [1, hidden], logits [1, V])


@dataclass
class Member:
    key: object
    store: object                                     # its LLM store (a DemandKV with a sink)
    solo: Callable[[torch.Tensor], Result]            # its own one-token step (the reference)
    allow: Callable[[], bool]                         # whether it may take part now (a shared second)
    decoding: bool = False


@dataclass
class Round:
    first: float
    rows: Dict[int, Tuple[torch.Tensor, Optional["torch.cuda.Event"]]] = field(default_factory=dict)
    started: bool = False
    done: bool = False
    error: str = ""
    results: Dict[int, Result] = field(default_factory=dict)
    event: Optional["torch.cuda.Event"] = None


class LLMRounds:
    """A group's rounds: membership, decoding marks, and the steps."""

    def __init__(self, llm, device, verdicts: Verdicts, check: Callable[[int], Tuple[bool, str]],
                 slots: int = 8, wait_s: float = 0.002, graphs: bool = True):
        self.llm, self.device, self.verdicts = llm, torch.device(device), verdicts
        self.check, self.slots, self.wait_s = check, int(slots), float(wait_s)
        self.graphs = bool(graphs) and self.device.type == "cuda"
        self.cv = threading.Condition()
        self.members: List[Member] = []
        self.group: Optional[GroupGraphs] = None
        self.open: Optional[Round] = None
        self.steps = threading.Lock()           # a group step's launches, a capture, a member's store moving
        self.last: Optional["torch.cuda.Event"] = None      # the last group step's end on the device
        self._checked: Dict[int, Tuple[bool, str]] = {}
        self.rounds = self.solo_steps = 0
        self.errors: List[str] = []

    # -- membership (with no step in flight: a host changes it under its exclusive gate) ---------------
    def join(self, key, store, solo: Callable[[torch.Tensor], Result], allow: Callable[[], bool] = lambda: True
             ) -> str:
        """Add a member (its store must have a sink); why its group steps together or not."""
        if getattr(store, "sink", None) is None:
            raise ValueError("a member of LLM rounds needs an LLM store with a sink (make_store(sink=True))")
        with self.cv:
            if len(self.members) >= self.slots:
                raise ValueError(f"these LLM rounds are full ({self.slots} members)")
            self.members.append(Member(key, store, solo, allow))
            self._retire()
            store.move_guard = self._moving
            return self.admitted()[1]

    def leave(self, key) -> None:
        with self.cv:
            for m in [m for m in self.members if m.key == key]:
                m.store.move_guard = None
                self.members.remove(m)
            self._retire()
            self.cv.notify_all()

    def _retire(self) -> None:
        """Let the group's graphs go, once their last step has run on the device."""
        self._settle()
        self.group = None

    def _settle(self) -> None:
        if self.last is not None:
            self.last.synchronize()

    @contextlib.contextmanager
    def _moving(self) -> Iterator[None]:
        """A member's store migrates in here: no group step launching, and the last one done on the device."""
        with self.steps:
            self._settle()
            yield

    def decoding(self, key, on: bool) -> None:
        """Mark a member as drawing its unit's slots (rounds wait for it) or done (they stop waiting)."""
        with self.cv:
            for m in self.members:
                if m.key == key:
                    m.decoding = bool(on)
            self.cv.notify_all()

    def admitted(self) -> Tuple[bool, str]:
        """Whether this group's size steps together (the device's check at that size, made once)."""
        n = len(self.members)
        if n < 2:
            return False, "one member steps its own graphs"
        if n not in self._checked:
            self._checked[n] = self.check(n)
        return self._checked[n]

    def report(self) -> Dict[str, object]:
        return {"members": len(self.members), "rounds": self.rounds, "solo_steps": self.solo_steps,
                "errors": list(self.errors)}

    # -- a step ----------------------------------------------------------------------------------------
    def step(self, key, embed: torch.Tensor) -> Result:
        """Member ``key``'s one-token forward of ``embed`` [1, hidden]: in a round where admitted, else alone."""
        me = self._slot(key)
        m = self.members[me]
        if not (self.admitted()[0] and m.allow()):
            self._count(solo=1)
            return m.solo(embed)
        store = m.store
        if store.length + 1 > store.capacity:
            store._room(store.length + 1)               # a grown store: the leader captures the group again
        ready = None
        if self.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        lead, rnd = self._join(me, embed, ready)
        if lead:
            self._run(rnd)
        if rnd.error or me not in rnd.results:
            self._count(solo=1)
            return m.solo(embed)
        h, logits = rnd.results[me]
        if rnd.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(rnd.event)
            h.record_stream(stream)
            logits.record_stream(stream)
        return h, logits

    def _slot(self, key) -> int:
        for i, m in enumerate(self.members):
            if m.key == key:
                return i
        raise KeyError(f"{key!r} is not a member of these LLM rounds")

    def _join(self, me: int, embed: torch.Tensor, ready) -> Tuple[bool, Round]:
        """Join the open round; (whether this member leads it, the round), after it has run unless leading."""
        with self.cv:
            rnd = self.open
            if rnd is None:
                rnd = self.open = Round(time.perf_counter())
            rnd.rows[me] = (embed, ready)
            if self._full(rnd):
                rnd.started, self.open = True, None
                return True, rnd
            end = rnd.first + self.wait_s
            while not rnd.done:
                left = end - time.perf_counter()
                if not rnd.started and (left <= 0 or self._full(rnd)):
                    rnd.started = True
                    if self.open is rnd:
                        self.open = None
                    return True, rnd
                self.cv.wait(max(left, 0.0005) if not rnd.started else 0.05)
            return False, rnd

    def _full(self, rnd: Round) -> bool:
        """Every decoding member has joined (a member that stopped decoding no longer holds the round back)."""
        return all(i in rnd.rows for i, m in enumerate(self.members) if m.decoding)

    def _run(self, rnd: Round) -> None:
        """Lead the round: one member alone runs its own step; more, the group step over every member's row."""
        alone = len(rnd.rows) == 1
        try:
            if alone:
                (i, (embed, _)), = rnd.rows.items()
                rnd.results[i] = self.members[i].solo(embed)
            else:
                self._group_step(rnd)
        except Exception as e:  # noqa: BLE001 - each member then steps alone; the host reports the line
            rnd.error = f"{type(e).__name__}: {e}"
            rnd.results.clear()
            self._quiet_stream()            # its launches done before the members step alone on their streams
        with self.cv:
            if rnd.error:
                self.errors.append(rnd.error)
            else:
                self.solo_steps += int(alone)
                self.rounds += int(not alone)
            rnd.done = True
            self.cv.notify_all()

    def _count(self, solo: int) -> None:
        with self.cv:
            self.solo_steps += solo

    def _quiet_stream(self) -> None:
        if self.device.type == "cuda":
            try:
                torch.cuda.current_stream(self.device).synchronize()
            except Exception:  # noqa: BLE001 - a broken context reports itself on the next call
                pass

    def _group_step(self, rnd: Round) -> None:
        """The group step over the round's rows, captured again first where a member joined, left or moved (a
        store may move between the capture and the step: then again, at most three times)."""
        stores = [m.store for m in self.members]
        for _ in range(3):
            if self.group is None or not self.group.valid_for(stores):
                self._recapture(stores)
            with self.steps:
                if self.group is not None and self.group.valid_for(stores):
                    self._launch(rnd, stores)
                    return
        raise RuntimeError("the members' LLM stores moved during every capture of the group step")

    def _recapture(self, stores) -> None:
        """New group graphs for ``stores``: the capture lock, then the step lock (so no store moves under the
        warm-up and capture, which write the members' sinks), the old graphs let go once their last step ran."""
        with GATE.capturing() if self.graphs else contextlib.nullcontext(), self.steps:
            self._retire()
            self.group = GroupGraphs(self.llm, stores, self.device, self.verdicts, capture=self.graphs)
            if self.graphs:
                torch.cuda.synchronize(self.device)      # the warm-up's writes done before a store may move

    def _launch(self, rnd: Round, stores) -> None:
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        if stream is not None and self.last is not None:
            stream.wait_event(self.last)                 # the last round (maybe another stream's) is off the buffers
        for _, ready in rnd.rows.values():
            if ready is not None:
                stream.wait_event(ready)
        hidden = self.llm.d.hidden
        rows = torch.zeros(len(stores), hidden, dtype=self.llm.lm_head.weight.dtype, device=self.device)
        for i, (embed, _) in rnd.rows.items():
            rows[i].copy_(embed.reshape(hidden))
        out = self.group.forward(rows, [i in rnd.rows for i in range(len(stores))])
        rnd.results.update({i: r for i, r in enumerate(out) if r is not None})
        if stream is not None:
            rnd.event = torch.cuda.Event()
            rnd.event.record(stream)
            self.last = rnd.event
