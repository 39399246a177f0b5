"""One session inside a host: its own state arenas, graphs, CUDA stream and RNG; shared weights.

:class:`HostedSession` quacks like :class:`~engine.session.DuplexSession` (``start``, ``process``,
``set_toggles``, ``toggles``, ``records``, ``info``, ``summary``, ``close``), so anything that runs
a session can run a hosted one. What it adds:

* ``start`` builds holding the host's gate *capturing* on CUDA (one build or capture in the process
  at a time; the other sessions' replaying seconds go on beside it), with the session's own RNG state
  installed, around weights from the host's :class:`~engine.host.weights.WeightsCache`; it measures
  what the device gained meanwhile (other sessions' transient allocations can blur it).
* ``process`` runs the second *shared* (concurrently with other sessions, on the session's own
  stream) when every step of it replays a graph, else *exclusive* with its RNG state installed
  (see :mod:`engine.core.gate`). The time spent waiting at the gate counts against the second's
  own deadline, like any queueing.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np
import torch

from engine.core import graphs
from engine.core.toggles import PendingToggles, Toggles
from engine.session import DuplexSession, SessionConfig
from engine.session.records import SecondRecord

from .rng import SessionRng
from .weights import WeightsKey

if TYPE_CHECKING:
    from .host import EngineHost


@dataclass
class SessionMemory:
    """What admitting the session added on its device (bytes; zeros on the CPU except ``state``)."""

    state: int = 0               # the session's state arenas (tail + backbone), as they report
    allocated: int = 0           # torch allocator: allocated after - before the build, less new shared weights
    reserved: int = 0            # torch allocator: reserved after - before (graph pools, cached blocks)
    shared_loaded: int = 0       # shared weights this admission loaded (0 when all were cached)
    weights_reused: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, object]:
        return {"state_bytes": self.state, "allocated_bytes": self.allocated, "reserved_bytes": self.reserved,
                "shared_weights_loaded_bytes": self.shared_loaded, "weights_reused": list(self.weights_reused)}


def _device_bytes(device: torch.device) -> Tuple[int, int]:
    if device.type != "cuda":
        return 0, 0
    torch.cuda.synchronize(device)
    return int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device))


class HostedSession:
    """A :class:`DuplexSession` run by an :class:`~engine.host.host.EngineHost`."""

    def __init__(self, host: "EngineHost", cfg: SessionConfig, sid: int):
        self.host = host
        self.cfg = cfg.resolved()
        self.id = int(sid)
        self.device = torch.device(self.cfg.device)
        self.rng = SessionRng(self.device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.session: Optional[DuplexSession] = None
        self.memory = SessionMemory()
        self.spans: List[Tuple[float, float]] = []          # host wall time of each second's work
        self.build_span: Optional[Tuple[float, float]] = None   # host wall time of the build (its captures)
        self.exclusive_seconds = 0
        self.in_shared_second = False           # a shared (concurrent) second is running now
        self.group = None                       # the batched-LISTEN group it belongs to, if any
        self.batched_note = ""
        self.llm_rounds = None                  # the LLM rounds it steps in, if any (llm_rounds.py)
        self.rounds_note = ""
        self._toggles = PendingToggles(Toggles(self.cfg.demand_sized, self.cfg.graph_replay))

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Build the models, sharing cached weights; measure the memory added. A CUDA build holds the gate
        *capturing* (one build or capture at a time; the other sessions' shared seconds go on beside it),
        then joins a batched group exclusively; a CPU build holds it exclusively (the CPU's default
        generator is swapped for the session's, and every CPU second runs exclusively anyway)."""
        cache, c = self.host.weights, self.cfg
        hold = self.host.gate.capturing(build=True) if self.device.type == "cuda" else self.host.gate.exclusive()
        # the build slows the others down: their seconds meanwhile are not the load (meter.pause)
        with self.host.meter.pause(), hold, self.rng.installed(), graphs.working_for(self.rng):
            b0 = time.perf_counter()
            alloc0, res0 = _device_bytes(self.device)
            keys = (WeightsKey.tail(c), WeightsKey.backbone(c))
            found = [cache.get(k) for k in keys]
            tail = None
            if found[0] is not None:
                from engine import registry
                tail = registry.get_tail(c.tail).make_tail(size=c.size, device=str(self.device), seed=c.seed,
                                                      checkpoint=c.checkpoint, shared=found[0])
            s = DuplexSession(c, tail=tail, backbone_shared=found[1])
            s.start()
            loaded = 0
            for key, hit, part in zip(keys, found, (s.tail, s.backbone)):
                if hit is None:
                    cache.put(key, getattr(part, "shared_weights", lambda: None)())
                    loaded += cache.bytes(key)
            alloc1, res1 = _device_bytes(self.device)
            self.build_span = (b0, time.perf_counter())
        self.session = s
        if self.host.batcher is not None:               # its group's capture reads the members' state
            with self.host.meter.pause(), self.host.gate.exclusive(), self.rng.installed(), \
                    graphs.working_for(self.rng):
                self.batched_note = self.host.batcher.join(self)
        self._join_rounds()
        self.memory = SessionMemory(state=int(s.tail.state_bytes()) + int(s.backbone.state_bytes()),
                                    allocated=max(0, alloc1 - alloc0 - loaded), reserved=max(0, res1 - res0),
                                    shared_loaded=loaded,
                                    weights_reused=[k.label() for k, hit in zip(keys, found) if hit is not None])

    def _join_rounds(self) -> None:
        """Into the host's LLM rounds, where it has them: their checks first beside the other sessions' seconds
        (shared), then the join itself with no round in flight (exclusive)."""
        if self.host.llm_rounds is not None:
            with self.host.meter.pause(), self.host.gate.shared(), graphs.working_for(self.rng):
                self.host.llm_rounds.prepare(self)
            with self.host.meter.pause(), self.host.gate.exclusive(), self.rng.installed(), \
                    graphs.working_for(self.rng):
                self.rounds_note = self.host.llm_rounds.join(self)

    def close(self) -> None:
        if self.session is not None:
            with self.host.meter.pause(), self.host.gate.exclusive():
                if self.host.llm_rounds is not None:
                    self.host.llm_rounds.leave(self)
                if self.host.batcher is not None:
                    self.host.batcher.leave(self)
                self.session.close()

    # -- one second ------------------------------------------------------------------------------
    def exclusive_needed(self, toggles_change: bool = False) -> bool:
        """Whether this second must run with nothing else in flight (see :mod:`engine.core.gate`)."""
        if self.device.type != "cuda" or toggles_change:
            return True
        s = self.session
        tail = s.tail.toggles() if s.tail is not None else {}
        backbone = s.backbone.toggles() if s.backbone is not None else {}
        return not (tail.get("graph_replay", False) and backbone.get("graph_replay", False))

    def process(self, frame, arrival: Optional[float] = None, backlog: int = 0) -> Tuple[np.ndarray, SecondRecord]:
        """Run one second, at the gate; its record counts the wait against its own deadline."""
        if self.session is None:
            raise RuntimeError("the hosted session is not started: call start() first")
        arrival = time.perf_counter() if arrival is None else arrival
        pending = self._toggles.take()
        exclusive = self.exclusive_needed(pending is not None)
        with self.host.gate.section(exclusive):
            t0 = time.perf_counter()
            rng = self.rng.installed() if exclusive else contextlib.nullcontext()
            stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
            self.in_shared_second = not exclusive
            regroup = pending is not None and self.host.batcher is not None
            rerounds = pending is not None and self.host.llm_rounds is not None
            with rng, stream, graphs.working_for(self.rng):
                if regroup:                          # a migration would move the state its group's graph reads
                    self.host.batcher.leave(self)
                if rerounds:                         # a policy switch replaces its LLM store (no sink)
                    self.host.llm_rounds.leave(self)
                if pending is not None:
                    self.session.set_toggles(pending)
                out, rec = self.session.process(frame, arrival=arrival, backlog=backlog)
                if regroup:
                    self.batched_note = self.host.batcher.join(self)
                if rerounds:
                    self.rounds_note = self.host.llm_rounds.join(self)
            self.in_shared_second = False
            t1 = time.perf_counter()
        self.exclusive_seconds += int(exclusive)
        self.spans.append((t0, t1))
        self.host.meter.record(t0, t1, rec.queue_wait_ms + rec.total_ms, self.id)
        return out, rec

    # -- the DuplexSession surface ------------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        """From the next second, which then runs exclusively (a capture or a migration may happen)."""
        self._toggles.ask(toggles)

    def asked_toggles(self) -> Toggles:
        return self._toggles.asked

    def toggles(self) -> Toggles:
        return self.session.toggles()

    @property
    def records(self) -> List[SecondRecord]:
        return self.session.records if self.session is not None else []

    @property
    def info(self) -> Dict[str, object]:
        info = dict(self.session.info) if self.session is not None else {"tail": self.cfg.tail}
        info.update(host_session=self.id, memory=self.memory.to_dict())
        return info

    def summary(self) -> Dict[str, object]:
        return self.session.summary()
