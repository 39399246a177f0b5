"""The sessions of one serving replica: which model it serves, admission, headroom for placement.

A replica owns one GPU (or, without one, the CPU) and hosts several live sessions on it through
the multi-session :class:`engine.host.EngineHost` (shared weights, per-session state, graphs,
stream and RNG; a hosted session's output is the one it gives alone, bit for bit). This module is
the small interface the Serve deployment talks to — :meth:`SessionHost.config_for`,
:meth:`SessionHost.admit`, :meth:`SessionHost.release`, :meth:`SessionHost.stats` — so the
deployment does not care how the sessions share the device.

Admission is the engine host's, by measured headroom (and ``max_sessions``). Right after a session
joins or leaves, the host measures a few seconds before it admits another; a client arriving then
waits here (up to :data:`MEASURE_WAIT_S`) instead of being turned away from a replica with room.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Dict, Optional

from engine import system_prompt
from engine.host import EngineHost, HostedRunner
from engine.host.weights import WeightsKey
from engine.session import SessionConfig

MEASURE_WAIT_S = 20.0        # longest a new session waits for the host to finish measuring
POLL_S = 0.25


class ModelMismatch(ValueError):
    """A client asked for a model this server does not serve."""


class SessionHost:
    """Live sessions of one replica over one served model (``base``); thread-safe.

    ``base`` is the server's :class:`SessionConfig` (model, weights, size, device); a client may
    choose the seed, the engine toggles and the synthetic policy's reply length of its own session
    (see :meth:`config_for`).
    """

    def __init__(self, base: SessionConfig, max_sessions: int = 32):
        if int(max_sessions) < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.base = base.resolved()
        self.max_sessions = int(max_sessions)
        self.engine = EngineHost(device=self.base.device, max_sessions=self.max_sessions)
        self._lock = threading.Lock()
        self.opened = 0                       # sessions admitted over the replica's life

    # -- what a client may ask --------------------------------------------------------------
    def config_for(self, asked: Dict[str, Any]) -> SessionConfig:
        """The session's config: the server's model with the client's seed, toggles and system prompt.

        Raises :class:`ModelMismatch` when the client names a tail, backbone, size or device other
        than the server's (``auto`` or nothing matches anything), ValueError for a bad value.
        """
        b = self.base
        for key in ("tail", "backbone", "size", "device"):
            want = asked.get(key)
            if want not in (None, "", "auto") and want != getattr(b, key):
                raise ModelMismatch(f"this server serves {b.tail} + {b.backbone} ({b.size} size on {b.device}); "
                                    f"the client asked for {key} {want!r}")
        changes: Dict[str, Any] = {}
        for key, kind in (("seed", int), ("reply_seconds", int), ("demand_sized", bool), ("graph_replay", bool),
                          ("input_rate", int)):     # input_rate: which the backbone takes, resolved() says
            if asked.get(key) is not None:
                value = asked[key]
                if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                    raise ValueError(f"{key} must be an integer, got {value!r}")
                if kind is bool and not isinstance(value, bool):
                    raise ValueError(f"{key} must be true or false, got {value!r}")
                changes[key] = value
        if asked.get("system_prompt") is not None:      # untrusted text: checked again here (one rule)
            changes["system_prompt"] = system_prompt.check(asked["system_prompt"])
        return b.replace(**changes).resolved()

    # -- sessions ---------------------------------------------------------------------------
    def measuring(self) -> bool:
        """Whether the host is still measuring its last change (too few seconds seen to decide) and
        has a free slot (a host at its session limit is full, measured or not)."""
        n, meter = self.engine.active(), self.engine.meter
        if not 0 < n < self.max_sessions:
            return False
        # the engine host's rule: too few seconds seen, and not yet long enough to decide on what was seen
        return (meter.headroom(n).seconds < self.engine.min_seconds * n
                and meter.measuring_for() < meter.min_seconds + 1.5)

    def admit(self, cfg: SessionConfig, results: Optional["queue.Queue"] = None,
              wait_s: float = MEASURE_WAIT_S) -> HostedRunner:
        """A started runner for ``cfg``, or :class:`engine.host.HostFull` saying why not.

        While the host is still measuring its last change, wait (at most ``wait_s``) for it.
        ``results``: the queue the runner puts its results on (one that wakes a reader, say).
        """
        deadline = time.monotonic() + wait_s
        while self.engine.refusal(cfg) is not None and self.measuring() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        runner = self.engine.open(cfg)
        if results is not None:
            runner.results = results
        with self._lock:
            self.opened += 1
        runner.start()
        return runner

    def release(self, runner: HostedRunner, drain: bool = False, timeout: float = 10.0) -> None:
        """Stop a session (the second in progress finishes; with ``drain`` every queued one too); the
        runner leaves the host by itself when it has stopped. Then the shared weights no live session
        uses any more are dropped (:meth:`forget_unused_weights`)."""
        runner.stop(timeout=timeout, drain=drain)
        self.forget_unused_weights()

    def forget_unused_weights(self) -> int:
        """Drop the shared weights that no live session uses, except the served model's own (the
        server's seed). A client may choose its seed, and random weights depend on it: each seed's
        weights were kept for the replica's life (~110 MB per session of tiny Step-Audio2 on a CPU,
        each with a new seed). Returns how many entries were dropped."""
        keep = {WeightsKey.tail(self.base), WeightsKey.backbone(self.base)}
        for s in self.engine.sessions():
            keep |= {WeightsKey.tail(s.cfg), WeightsKey.backbone(s.cfg)}
        return self.engine.weights.retain(keep)

    def close_all(self) -> None:
        """Stop every session (the replica is going away)."""
        self.engine.close()

    def active(self) -> int:
        return self.engine.active()

    # -- headroom -----------------------------------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        """Sessions, limit and deadline headroom (ms) — what the request router places by."""
        n = self.engine.active()
        h = self.engine.meter.headroom(n)
        per_session = h.cost_ms if h.cost_ms > 0 else h.budget_ms / self.max_sessions
        return {"sessions": n, "max_sessions": self.max_sessions, "headroom_ms": round(h.free_ms, 3),
                "ms_per_session": round(per_session, 3), "busy_ms": round(h.busy_ms, 3),
                "worst_ms": round(h.worst_ms, 3), "measured_seconds": h.seconds, "opened": self.opened}
