"""One session inside a host: its own state arenas, graphs, CUDA stream and RNG; shared weights.

:class:`HostedSession` quacks like :class:`~engine.session.DuplexSession` (``start``, ``process``,
``set_toggles``, ``toggles``, ``records``, ``info``, ``summary``, ``close``), so anything that runs a session can
run a hosted one. Its build and every one of its seconds run on the device's scheduler thread
(:mod:`engine.host.scheduler`), each in a greenlet of its own with the session's random state on the default
generators and its own stream current; called from another thread, :meth:`start` and :meth:`process` hand the
work to the scheduler and wait for it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np
import torch

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
    horizon: int = 0             # the state once grown to the host's horizon at the declared worst case

    def to_dict(self) -> Dict[str, object]:
        return {"state_bytes": self.state, "allocated_bytes": self.allocated, "reserved_bytes": self.reserved,
                "shared_weights_loaded_bytes": self.shared_loaded, "weights_reused": list(self.weights_reused),
                "horizon_state_bytes": self.horizon}


def _device_bytes(device: torch.device) -> Tuple[int, int]:
    if device.type != "cuda":
        return 0, 0
    return int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device))


class HostedSession:
    """A :class:`DuplexSession` run by an :class:`~engine.host.host.EngineHost`'s scheduler."""

    def __init__(self, host: "EngineHost", cfg: SessionConfig, sid: int):
        self.host = host
        self.cfg = cfg.resolved()
        self.id = int(sid)
        self.device = torch.device(self.cfg.device)
        self.rng = SessionRng(self.device)
        # the steps the scheduler may batch with other sessions' (what the backbone's entry declares)
        from engine import registry
        self.batched_steps = frozenset(registry.get_backbone(self.cfg.backbone).batched_steps)
        self.stream = None                       # made on the scheduler's thread (make_stream)
        self.session: Optional[DuplexSession] = None
        self.memory = SessionMemory()
        self.spans: List[Tuple[float, float]] = []          # host wall time of each second's work
        self.build_span: Optional[Tuple[float, float]] = None
        self._toggles = PendingToggles(Toggles(self.cfg.demand_sized, self.cfg.graph_replay))

    def make_stream(self) -> None:
        """The session's own CUDA stream (its seconds launch there; made on the scheduler's thread)."""
        if self.device.type == "cuda" and self.stream is None:
            self.stream = torch.cuda.Stream(self.device)

    # -- building ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Build the session (on the scheduler's thread, in slices between the other sessions' seconds)."""
        self.host.run_task(self, self.build, "build")

    def build(self) -> None:
        """The build's body (a greenlet on the scheduler's thread): weights from the host's cache where another
        session of the same key loaded them, then the session's own state, graphs and prelude."""
        cache, c = self.host.weights, self.cfg
        with self.host.meter.pause():          # the build slows the others down: not their load
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
        self.memory = SessionMemory(state=int(s.tail.state_bytes()) + int(s.backbone.state_bytes()),
                                    allocated=max(0, alloc1 - alloc0 - loaded), reserved=max(0, res1 - res0),
                                    shared_loaded=loaded,
                                    weights_reused=[k.label() for k, hit in zip(keys, found) if hit is not None],
                                    horizon=int(s.tail.state_bytes()) + int(s.backbone.horizon_bytes(self.host.horizon_s)))

    def growth_left(self) -> int:
        """Bytes this session's state will still grow by before the host's horizon (0 once built state is there)."""
        s = self.session
        if s is None or s.tail is None or s.backbone is None:
            return 0
        return max(0, self.memory.horizon - int(s.tail.state_bytes()) - int(s.backbone.state_bytes()))

    def close(self) -> None:
        """Release the models (on the scheduler's thread, between this session's seconds)."""
        if self.session is not None:
            self.host.scheduler.run(self._close)

    def _close(self) -> None:
        self.host.scheduler.remove_member(self)
        if self.session is not None:
            with self.host.meter.pause():
                self.session.close()

    def batch_member(self):
        """The object the backbone's batched steps know this session by (its backbone)."""
        return None if self.session is None else self.session.backbone

    # -- one second ------------------------------------------------------------------------------------
    def process(self, frame, arrival: Optional[float] = None, backlog: int = 0) -> Tuple[np.ndarray, SecondRecord]:
        """Run one second (on the scheduler's thread, as one of its greenlets); its record counts any wait
        before it started against its own deadline."""
        if self.session is None:
            raise RuntimeError("the hosted session is not started: call start() first")
        arrival = time.perf_counter() if arrival is None else arrival
        return self.host.run_task(self, lambda: self.second(frame, arrival, backlog), "second", arrival + 1.0)

    def second(self, frame, arrival: float, backlog: int) -> Tuple[np.ndarray, SecondRecord]:
        """The body of one second (a greenlet on the scheduler's thread)."""
        t0 = time.perf_counter()
        pending = self._toggles.take()
        if pending is not None:
            self.session.set_toggles(pending)
        out, rec = self.session.process(frame, arrival=arrival, backlog=backlog)
        t1 = time.perf_counter()
        self.spans.append((t0, t1))
        self.host.meter.record(t0, t1, rec.queue_wait_ms + rec.total_ms, self.id)
        return out, rec

    def ahead(self, stop=None) -> None:
        """Between seconds, in the scheduler's slack: what the next second replays (the session's ``ahead``;
        ``stop``: asked between captures, True once the next frame is here)."""
        if self.session is not None:
            self.session.ahead(stop=stop)

    # -- the DuplexSession surface ------------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        """From the next second on (a capture or a migration may happen in it)."""
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
