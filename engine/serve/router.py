"""Placement: a new session goes to the replica with the most deadline headroom.

Serve's default router picks the shorter queue of two random replicas. A live session instead
wants the replica whose GPU has the most of its one-second deadline free: each replica reports
``headroom_ms`` / ``ms_per_session`` / ``sessions`` through ``record_routing_stats`` (see
:meth:`engine.serve.hosting.SessionHost.stats`), and :class:`HeadroomRouter` ranks the replicas by
it. The reports arrive every ``request_routing_stats_period_s``; sessions this router placed
since a replica's last report are subtracted at that replica's per-session cost, so a burst of
new sessions spreads instead of piling onto the replica that looked emptiest a second ago.
"""
from __future__ import annotations

import collections
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica


#: assumed before any replica has reported (ms): a whole deadline free, a cautious cost per session
FRESH_HEADROOM_MS, FRESH_COST_MS = 1000.0, 250.0


def expected_headroom(stats: Mapping[str, Any], placed_here: int, fresh: Tuple[float, float] = (
        FRESH_HEADROOM_MS, FRESH_COST_MS)) -> Tuple[float, int]:
    """``(headroom_ms, sessions)`` of a replica once the sessions placed since its report count.

    ``placed_here``: sessions this router has open on the replica now. A replica that has not
    reported yet is taken as the ``fresh`` ``(headroom_ms, ms_per_session)``: no better than the
    best replica that did report, and charged for the sessions already placed on it.
    """
    reported = int(stats.get("sessions", 0) or 0)
    headroom = float(stats["headroom_ms"]) if "headroom_ms" in stats else fresh[0]
    per_session = float(stats.get("ms_per_session") or fresh[1])
    unreported = max(0, int(placed_here) - reported)
    return headroom - per_session * unreported, max(reported, int(placed_here))


def rank_by_headroom(entries: Sequence[Tuple[Any, Mapping[str, Any], int]]) -> List[Any]:
    """The replicas of ``entries`` (``(replica, stats, placed_here)``), most headroom first.

    A replica at its session limit goes behind every other one (it would only refuse); ties go to
    the replica with fewer sessions, then keep the given order.
    """
    reports = [st for _, st, _ in entries if st and "headroom_ms" in st]
    fresh = (max((float(st["headroom_ms"]) for st in reports), default=FRESH_HEADROOM_MS),
             max((float(st.get("ms_per_session") or 0.0) for st in reports), default=0.0) or FRESH_COST_MS)
    scored = []
    for order, (replica, stats, placed) in enumerate(entries):
        stats = stats or {}
        headroom, sessions = expected_headroom(stats, placed, fresh)
        limit = int(stats.get("max_sessions", 0) or 0)
        full = bool(limit) and sessions >= limit
        scored.append((full, -headroom, sessions, order, replica))
    scored.sort(key=lambda t: t[:4])
    return [t[4] for t in scored]


class HeadroomRouter(RequestRouter):
    """Ranks the candidate replicas by expected deadline headroom; one replica per rank.

    Serve tries rank by rank and skips a replica whose ``max_ongoing_requests`` is reached, so the
    first replica that still takes connections gets the session. A replica that is full by our
    own measure still takes the connection and refuses the session with a clear message.
    """

    def initialize_state(self, **kwargs) -> None:
        self._placed: Dict[ReplicaID, int] = collections.Counter()

    def _placed_counts(self) -> Dict[ReplicaID, int]:
        if not hasattr(self, "_placed"):
            self._placed = collections.Counter()
        return self._placed

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        placed = self._placed_counts()
        entries = [(r, r.routing_stats, placed.get(r.replica_id, 0)) for r in candidate_replicas]
        return [[r] for r in rank_by_headroom(entries)]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        self._placed_counts()[replica_id] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        placed = self._placed_counts()
        if placed.get(replica_id, 0) > 0:
            placed[replica_id] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._placed_counts().pop(replica_id, None)
