"""The engine host: N duplex sessions in one process on one device, every one against its own deadline.

    host = EngineHost(device="cuda")
    runner = host.open(SessionConfig(tail="step-audio2"))   # HostFull: one line saying why not
    runner.start(); runner.submit(frame); runner.results.get()

* **One scheduler per device** (:mod:`engine.host.scheduler`): the only thread that launches the device's work.
  Every session's build and seconds run there, each second against its own deadline (its frame's arrival + 1 s),
  earliest first; the steps a backbone declares batchable (MiniCPM-o's one-token LLM forwards) run once for every
  session parked at them, each session keeping the bits of its own step.
* **Weights once.** Sessions of the same model, size, device, checkpoint and seed share one copy of the weights
  (:class:`~engine.host.weights.WeightsCache`); each session has its own state arenas, graphs, CUDA stream and
  random state (:class:`~engine.host.rng.SessionRng`), so its output is the one it would give alone.
* **Admission by measured headroom** (:mod:`engine.host.admission`): a session is refused when the seconds
  measured so far say one more would make a second miss, when the device lacks memory for one more, or at
  ``max_sessions``.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from engine.session import SessionConfig

from .admission import HostFull, LoadMeter, memory_refusal
from .runner import HostedRunner
from .scheduler import BATCH_WAIT_S, Scheduler
from .session import HostedSession
from .tasks import DONE
from .weights import WeightsCache

#: how long a session is admitted for: the memory it will hold after this long at its declared worst case must fit
HORIZON_S = 600.0


class EngineHost:
    """Runs many duplex sessions on one device through its scheduler; see the module docstring.

    ``batched``: the scheduler runs the backbones' batched steps (off: each session runs its own steps, through
    the same scheduler; the same bits either way)."""

    def __init__(self, device: str = "auto", max_sessions: Optional[int] = None, reserve_ms: float = 100.0,
                 window_s: float = 10.0, min_seconds: int = 3, batched: bool = True,
                 batch_wait_s: float = BATCH_WAIT_S, horizon_s: float = HORIZON_S):
        if max_sessions is not None and int(max_sessions) < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        if not (float(horizon_s) > 0 and np.isfinite(horizon_s)):
            raise ValueError(f"horizon_s must be a positive number of seconds, got {horizon_s}")
        self.horizon_s = float(horizon_s)
        self.device = torch.device(SessionConfig(device=device).resolved().device)
        self.max_sessions = None if max_sessions is None else int(max_sessions)
        self.min_seconds = int(min_seconds)
        self.weights = WeightsCache()
        self.meter = LoadMeter(window_s=window_s, reserve_ms=reserve_ms, min_seconds=min_seconds)
        self.scheduler = Scheduler(self.device, batched=batched, batch_wait_s=batch_wait_s)
        self._lock = threading.Lock()
        self._admitting = threading.Lock()
        self._sessions: Dict[int, HostedSession] = {}
        self._runners: List[HostedRunner] = []
        self._next_id = 0

    # -- admission ---------------------------------------------------------------------------------
    def refusal(self, cfg: SessionConfig) -> Optional[str]:
        """Why a session of ``cfg`` would be refused now (one line), or None when it would be admitted."""
        c = cfg.resolved()
        if torch.device(c.device).type != self.device.type:
            return f"this host runs sessions on {self.device.type}; the session asks for {c.device}"
        n = self.active()
        if self.max_sessions is not None and n >= self.max_sessions:
            return f"the host is full: {n} of {self.max_sessions} sessions"
        why = self.meter.refusal(n, self.min_seconds * n)
        if why is None and self.device.type == "cuda":
            free = self.scheduler.run(self._free_bytes) - self._growth_left()
            why = memory_refusal(free, self._session_bytes(), horizon_s=self.horizon_s)
        return why

    def _growth_left(self) -> int:
        """What the admitted sessions' state will still grow by before the horizon."""
        return sum(s.growth_left() for s in self.sessions())

    def _free_bytes(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(free + max(0, cached))

    def _session_bytes(self) -> int:
        """The most any admitted session added (its own state, graphs and pools) plus what its state grows by to
        the horizon; 0 before the first."""
        with self._lock:
            return max((max(s.memory.allocated, s.memory.reserved) + max(0, s.memory.horizon - s.memory.state)
                        for s in self._sessions.values()), default=0)

    def _register(self, cfg: SessionConfig, force: bool) -> HostedSession:
        with self._admitting:                  # one decision at a time: two callers cannot take one slot
            why = None if force else self.refusal(cfg)
            if why is not None:
                raise HostFull(why)
            with self._lock:
                hosted = HostedSession(self, cfg, self._next_id)
                self._sessions[hosted.id] = hosted
                self._next_id += 1
        return hosted

    def open(self, cfg: SessionConfig, force: bool = False) -> HostedRunner:
        """Admit a session and return its runner (call ``start()``); raises :class:`HostFull` when
        admission refuses (``force`` skips the headroom and memory checks, not the device check)."""
        if force and torch.device(cfg.resolved().device).type != self.device.type:
            raise HostFull(f"this host runs sessions on {self.device.type}; the session asks for {cfg.device}")
        runner = HostedRunner(self, self._register(cfg, force))
        with self._lock:
            self._runners.append(runner)
        self.meter.sessions_changed()
        return runner

    def admit(self, cfg: SessionConfig, force: bool = False) -> HostedSession:
        """Admit and build a session now, for callers that run its seconds themselves (``process``)."""
        hosted = self._register(cfg, force)
        try:
            hosted.start()
        except BaseException:
            self._forget(hosted)
            raise
        self.meter.sessions_changed()
        return hosted

    def run_task(self, hosted: HostedSession, body: Callable[[], object], what: str,
                 deadline: Optional[float] = None) -> object:
        """``body()`` as one greenlet of ``hosted`` on the scheduler, waited for from the calling thread."""
        if self.scheduler.on_loop():
            raise RuntimeError("the scheduler's own thread cannot wait for one of its greenlets")
        done = threading.Event()
        box: List[object] = []

        def finished(task) -> None:
            box.append(task)
            done.set()

        when = time.perf_counter() if deadline is None else deadline
        self.scheduler.run(lambda: self.scheduler.spawn(hosted, body, what, when, finished))
        done.wait()
        task = box[0]
        if task.state != DONE:
            raise task.value
        return task.value

    # -- leaving -----------------------------------------------------------------------------------
    def release(self, runner: HostedRunner) -> None:
        """A runner has stopped: its slot is free (called by the runner)."""
        with self._lock:
            if runner in self._runners:
                self._runners.remove(runner)
        self._forget(runner.hosted)

    def remove(self, hosted: HostedSession) -> None:
        """Close a session admitted with :meth:`admit`."""
        hosted.close()
        self._forget(hosted)

    def _forget(self, hosted: HostedSession) -> None:
        with self._lock:
            self._sessions.pop(hosted.id, None)
        self.meter.sessions_changed()

    def close(self) -> None:
        """Stop every runner (without draining) and every session, then the scheduler."""
        for r in list(self._runners):
            r.stop(timeout=30.0)
        for s in list(self._sessions.values()):
            self.remove(s)
        self.scheduler.close()

    # -- reporting ---------------------------------------------------------------------------------
    def active(self) -> int:
        """Sessions admitted and not yet gone (including those still being built)."""
        with self._lock:
            return len(self._sessions)

    def sessions(self) -> List[HostedSession]:
        with self._lock:
            return list(self._sessions.values())

    def headroom_ms(self) -> float:
        """Of the 1 s deadline less the reserve, how many ms per second are still free (measured)."""
        return self.meter.headroom(self.active()).free_ms

    def memory(self) -> Dict[str, object]:
        """Per session: what its admission added; shared weights per key; the device's totals."""
        out: Dict[str, object] = {"sessions": {s.id: s.memory.to_dict() for s in self.sessions()},
                                  "shared_weights": self.weights.report()}
        if self.device.type == "cuda":
            out["allocated_bytes"] = int(torch.cuda.memory_allocated(self.device))
            out["reserved_bytes"] = int(torch.cuda.memory_reserved(self.device))
        return out

    def memory_summary(self) -> Dict[str, float]:
        """MiB: the median session's state and what its admission added, the shared weights, the device's
        reserved total."""
        mem = self.memory()
        per = list(mem["sessions"].values())
        med = lambda key: float(np.median([m[key] for m in per])) / 2**20 if per else 0.0       # noqa: E731
        return {"per_session_state_mib": round(med("state_bytes"), 1),
                "per_session_allocated_mib": round(med("allocated_bytes"), 1),
                "per_session_reserved_mib": round(med("reserved_bytes"), 1),
                "shared_weights_mib": round(sum(v["bytes"] for v in mem["shared_weights"].values()) / 2**20, 1),
                "device_reserved_mib": round(mem.get("reserved_bytes", 0) / 2**20, 1)}

    def scheduler_report(self) -> Dict[str, object]:
        """What the scheduler did so far (turns, batches by kind and size, build slices, host busy time)."""
        return self.scheduler.stats.to_dict()
