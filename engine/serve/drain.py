"""Drain means drain: SIGINT / SIGTERM stop admitting, live sessions get a grace period, then close.

The command (``duplexcadence serve``) and its replicas share one fact through Ray's internal
key-value store: the wall-clock time at which the grace period ends (:data:`KEY`). Once it is
there, every replica refuses new sessions ("the server is shutting down"); live sessions go on
until their client stops or the grace period ends, when the replica closes them with a message
(the client keeps every second it received). The command waits until no session is left (or the
grace period and a margin have passed), then stops Serve and Ray. A second signal stops at once.

SIGTERM is what systemd and docker send; it drains exactly like Ctrl-C (which a terminal sends to
the whole foreground process group: Ray's processes survive it, the command drains).
"""
from __future__ import annotations

import signal
import time
from typing import Callable, Optional

from engine.signals import CaughtSignals

KEY = b"duplexcadence:drain-until"
NAMESPACE = "duplexcadence"
#: after the grace period, how long the command waits for replicas to close their sessions
CLOSE_MARGIN_S = 15.0
POLL_S = 0.5


# -- both sides: the shared deadline ----------------------------------------------------------------
def publish(deadline: Optional[float]) -> None:
    """Announce the end of the grace period (epoch seconds) to every replica; None clears it."""
    from ray.experimental import internal_kv as kv
    if deadline is None:
        kv._internal_kv_del(KEY, namespace=NAMESPACE)
    else:
        kv._internal_kv_put(KEY, repr(float(deadline)).encode(), overwrite=True, namespace=NAMESPACE)


def deadline() -> Optional[float]:
    """The end of the grace period when the server is draining, else None (read by replicas)."""
    from ray.experimental import internal_kv as kv
    if not kv._internal_kv_initialized():
        return None
    try:
        raw = kv._internal_kv_get(KEY, namespace=NAMESPACE)
        return float(raw.decode()) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None


# -- the command's side -----------------------------------------------------------------------------
class DrainSignals(CaughtSignals):
    """SIGINT and SIGTERM: the first starts the drain (``event``), a second one stops at once
    (``now``). A context manager; the previous handlers come back on exit."""

    def wait(self) -> None:
        """Until the first signal (short sleeps keep the handlers responsive)."""
        while not self.event.wait(POLL_S):
            pass


def drain(signals: DrainSignals, grace_s: float, live_sessions: Callable[[], int],
          say: Callable[[str], None]) -> bool:
    """Announce the drain, then wait for the live sessions (at most ``grace_s`` plus a margin for the
    replicas to close theirs). False when a second signal cut it short."""
    until = time.time() + grace_s
    publish(until)
    n = _count(live_sessions)
    say(f"draining ({signal.Signals(signals.signum).name if signals.signum else 'stop'}): no new sessions; "
        f"{n if n >= 0 else 'the'} live session{'s' if n != 1 else ''} may run up to {grace_s:g} s more, then "
        "are closed with a message (signal again to stop now)")
    last = until + CLOSE_MARGIN_S
    while time.time() < last:
        if signals.now.wait(POLL_S * 2):
            say("stopping now: live sessions are cut off")
            return False
        if _count(live_sessions) == 0:
            break
    return True


def _count(live_sessions: Callable[[], int]) -> int:
    try:
        return int(live_sessions())
    except Exception:  # noqa: BLE001 - a replica that does not answer has nothing to wait for
        return -1


def replica_sessions(timeout: float = 5.0) -> int:
    """Live sessions on every replica of this Serve application (their routing stats)."""
    import ray
    total = 0
    for a in ray.util.list_named_actors(all_namespaces=True):
        if "DuplexSessions" not in a["name"]:
            continue
        try:
            actor = ray.get_actor(a["name"], namespace=a["namespace"])
            total += int(ray.get(actor.record_routing_stats.remote(), timeout=timeout).get("sessions", 0))
        except Exception:  # noqa: BLE001 - a replica going away has no session left
            continue
    return total
