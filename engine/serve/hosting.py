"""The sessions of one serving replica: which model it serves, admission by deadline headroom.

A replica owns one GPU (or, without one, the CPU) and hosts several live sessions on it. This
module is the small interface the Serve deployment talks to — :meth:`SessionHost.open`,
:meth:`SessionHost.release`, :meth:`SessionHost.stats` — so the deployment does not care how the
sessions share the device. Today each session is a :class:`engine.session.LiveRunner` (its own
worker thread and :class:`~engine.session.DuplexSession`), which is exactly what the embedded
app runs, so a remote session's output is the embedded one's bit for bit.

Headroom: every session must finish each second within the 1 s deadline. Sessions on one device
slow each other down, so each session's measured seconds already include the others' load; the
replica's headroom is the deadline minus its slowest session's recent mean work per second, less
an estimate for sessions that have not finished a second yet. A new session is admitted while the
session count is under ``max_sessions`` and the predicted headroom after it stays positive.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional

from engine.session import LiveRunner, SessionConfig
from engine.session.records import DEADLINE_MS

#: seconds of a session's recent history that count for its load
RECENT = 5


def _mean_recent_ms(runner) -> Optional[float]:
    """A session's mean work per second over its last :data:`RECENT` seconds; None before its first."""
    session = getattr(runner, "session", None)
    records = list(getattr(session, "records", []) or [])[-RECENT:]
    if not records:
        return None
    return sum(r.total_ms for r in records) / len(records)


class ModelMismatch(ValueError):
    """A client asked for a model this server does not serve."""


class SessionHost:
    """Live sessions of one replica over one served model (``base``); thread-safe.

    ``base`` is the server's :class:`SessionConfig` (model, weights, size, device); a client may
    choose the seed, the engine toggles and the synthetic policy's reply length of its own session
    (see :meth:`config_for`). ``runner_factory(cfg)`` makes a session runner with the interface of
    :class:`LiveRunner`.
    """

    def __init__(self, base: SessionConfig, max_sessions: int = 4,
                 runner_factory: Callable[[SessionConfig], Any] = LiveRunner):
        if int(max_sessions) < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.base = base.resolved()
        self.max_sessions = int(max_sessions)
        self._factory = runner_factory
        self._lock = threading.Lock()
        self._runners: List[Any] = []
        self.opened = 0                       # sessions opened over the replica's life

    # -- what a client may ask --------------------------------------------------------------
    def config_for(self, asked: Dict[str, Any]) -> SessionConfig:
        """The session's config: the server's model with the client's seed and toggles.

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
        for key, kind in (("seed", int), ("reply_seconds", int), ("demand_sized", bool), ("graph_replay", bool)):
            if asked.get(key) is not None:
                value = asked[key]
                if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                    raise ValueError(f"{key} must be an integer, got {value!r}")
                if kind is bool and not isinstance(value, bool):
                    raise ValueError(f"{key} must be true or false, got {value!r}")
                changes[key] = value
        return b.replace(**changes).resolved()

    # -- sessions ---------------------------------------------------------------------------
    def admit_reason(self) -> Optional[str]:
        """None when one more session fits; else why not (one sentence)."""
        with self._lock:
            n = len(self._runners)
            if n >= self.max_sessions:
                return f"this replica hosts its maximum of {self.max_sessions} sessions"
            s = self._stats_locked()
            if s["headroom_ms"] - s["ms_per_session"] < 0:
                return (f"this replica has {s['headroom_ms']:.0f} ms of its {DEADLINE_MS:.0f} ms deadline left, "
                        f"one more session needs about {s['ms_per_session']:.0f} ms")
            return None

    def open(self, cfg: SessionConfig):
        """Start a session runner for ``cfg`` (building the models happens in its worker)."""
        runner = self._factory(cfg)
        with self._lock:
            self._runners.append(runner)
            self.opened += 1
        runner.start()
        return runner

    def release(self, runner, drain: bool = False, timeout: float = 10.0) -> None:
        """Stop a session (the second in progress finishes) and forget it."""
        try:
            runner.stop(timeout=timeout, drain=drain)
        finally:
            session = getattr(runner, "session", None)
            if session is not None and hasattr(session, "close"):
                session.close()
            with self._lock:
                if runner in self._runners:
                    self._runners.remove(runner)

    def close_all(self) -> None:
        """Stop every session (the replica is going away)."""
        with self._lock:
            runners = list(self._runners)
        for r in runners:
            self.release(r, timeout=2.0)

    def active(self) -> int:
        with self._lock:
            return len(self._runners)

    # -- headroom -----------------------------------------------------------------------------
    def stats(self) -> Dict[str, Any]:
        """Sessions, limit and deadline headroom (ms) — what the request router places by."""
        with self._lock:
            return self._stats_locked()

    def _stats_locked(self) -> Dict[str, Any]:
        means = [m for m in (_mean_recent_ms(r) for r in self._runners) if m is not None]
        unmeasured = len(self._runners) - len(means)
        worst = max(means, default=0.0)
        per_session = worst / len(means) if means else DEADLINE_MS / self.max_sessions
        headroom = DEADLINE_MS - worst - per_session * unmeasured
        return {"sessions": len(self._runners), "max_sessions": self.max_sessions,
                "headroom_ms": round(headroom, 3), "ms_per_session": round(per_session, 3),
                "worst_ms": round(worst, 3), "opened": self.opened}
