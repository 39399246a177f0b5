"""The engine host: N duplex sessions in one process on one device, every one against its own deadline.

    host = EngineHost(device="cuda", launch="threads")
    runner = host.open(SessionConfig(tail="step-audio2"))   # HostFull: one line saying why not
    runner.start(); runner.submit(frame); runner.results.get()

* **Weights once.** Sessions of the same model, size, device, checkpoint and seed share one copy of
  the weights (:class:`~engine.host.weights.WeightsCache`); each session has its own state arenas,
  graphs (captured serially when it is admitted), CUDA stream and RNG state
  (:class:`~engine.host.rng.SessionRng`), so its output is the one it would give alone.
* **Seconds on time.** Each second is timed against its own frame's arrival (deadline = arrival +
  1 s); ``launch="threads"`` runs each session on its own thread (graph-replay seconds overlap),
  ``launch="one"`` one dispatcher thread, earliest deadline first (:mod:`engine.host.runner`).
* **Admission by measured headroom** (:mod:`engine.host.admission`): a session is refused when the
  seconds measured so far say one more would make a second miss, when the device lacks memory for
  one more, or at ``max_sessions``.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

import torch

from engine.session import SessionConfig

from .admission import HostFull, LoadMeter, memory_refusal
from engine.core.gate import GATE
from .groups import ListenBatcher
from .llm_rounds import LLMRoundsHost
from .runner import Dispatcher, HostedRunner
from .session import HostedSession
from .weights import WeightsCache

LAUNCH_MODES = ("threads", "one")


class EngineHost:
    """Runs many duplex sessions on one device; see the module docstring."""

    def __init__(self, device: str = "auto", launch: str = "threads", max_sessions: Optional[int] = None,
                 reserve_ms: float = 100.0, window_s: float = 10.0, min_seconds: int = 3,
                 batched: bool = False, batch_slots: int = 8, hand_over: bool = True, llm_rounds: bool = False):
        # ``hand_over``: a session build gives the capture lock, between its captures and at the ends of its
        # phases, to a running session that waits to capture (Gate.let_waiters_capture); process-wide while this
        # host lives. On by default since session 23 (H200: the GPU host tests pass with it on and off, and the
        # 4th MiniCPM-o build no longer holds running sessions' seconds 5-12 s; docs/device-notes-session23.md).
        if launch not in LAUNCH_MODES:
            raise ValueError(f"unknown launch mode {launch!r}; choose one of: {', '.join(LAUNCH_MODES)}")
        if max_sessions is not None and int(max_sessions) < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.device = torch.device(SessionConfig(device=device).resolved().device)
        self.launch = launch
        self.max_sessions = None if max_sessions is None else int(max_sessions)
        self.min_seconds = int(min_seconds)
        self.weights = WeightsCache()
        self.gate = GATE                            # the process's one gate (engine.core.gate)
        self.meter = LoadMeter(window_s=window_s, reserve_ms=reserve_ms, min_seconds=min_seconds)
        self._lock = threading.Lock()
        self._admitting = threading.Lock()
        self._sessions: Dict[int, HostedSession] = {}
        self._runners: List[HostedRunner] = []
        self._next_id = 0
        self._dispatcher: Optional[Dispatcher] = Dispatcher() if launch == "one" else None
        self.batcher: Optional[ListenBatcher] = ListenBatcher(self, batch_slots) if batched else None
        # ``llm_rounds``: MiniCPM-o sessions step their one-token LLM forwards together (llm_rounds.py)
        self.llm_rounds: Optional[LLMRoundsHost] = LLMRoundsHost(self, batch_slots) if llm_rounds else None
        self._hand_over_before = GATE.hand_over
        GATE.hand_over = bool(hand_over)

    # -- batched LISTEN (opt-in) -------------------------------------------------------------------
    def batched_check(self, cfg: SessionConfig, slots: Optional[int] = None) -> Tuple[bool, str]:
        """Whether a group of ``slots`` sessions of ``cfg`` (None: ``batch_slots``) would replay LISTEN
        batched here, and why (or why not).

        Builds one session of ``cfg`` (its weights stay cached) and runs the start-up check at that slot
        count: batched steps against each session's own steps on random inputs, bit for bit, on this device
        (a group of another size is checked at its own size when it forms)."""
        if self.batcher is None:
            return False, "batched replay is off (EngineHost(batched=True) turns it on)"
        probe = self.admit(cfg, force=True)
        try:
            gemm, why = self.batcher.verdict(getattr(probe.session.backbone, "model", None), slots)
        finally:
            self.remove(probe)
        return gemm is not None, why

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
            why = memory_refusal(self._free_bytes(), self._session_bytes())
        return why

    def _free_bytes(self) -> int:
        with self.gate.shared():                    # no CUDA call while an admission captures graphs
            free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(free + max(0, cached))

    def _session_bytes(self) -> int:
        """The most any admitted session added (its own state, graphs and pools), 0 before the first."""
        with self._lock:
            return max((max(s.memory.allocated, s.memory.reserved) for s in self._sessions.values()), default=0)

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
        """Admit and build a session now (synchronously), for callers that run seconds themselves."""
        hosted = self._register(cfg, force)
        try:
            hosted.start()
        except BaseException:
            self._forget(hosted)
            raise
        self.meter.sessions_changed()
        return hosted

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
        """Stop every runner (without draining) and every session; the host can be dropped after."""
        for r in list(self._runners):
            r.stop(timeout=5.0)
        for s in list(self._sessions.values()):
            self.remove(s)
        if self._dispatcher is not None:
            self._dispatcher.close()
            self._dispatcher = None
        GATE.hand_over = self._hand_over_before

    # -- the dispatcher (launch="one") -----------------------------------------------------------------
    def dispatcher_add(self, runner: HostedRunner) -> None:
        if self._dispatcher is not None:
            self._dispatcher.add(runner)

    def dispatcher_poke(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.poke()

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
        if self.batcher is not None:
            out["batched_groups"] = self.batcher.report()
        if self.device.type == "cuda":
            out["allocated_bytes"] = int(torch.cuda.memory_allocated(self.device))
            out["reserved_bytes"] = int(torch.cuda.memory_reserved(self.device))
        return out
