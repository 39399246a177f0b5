"""The host's LLM rounds (opt-in, ``EngineHost(llm_rounds=True)``): hosted MiniCPM-o sessions of one set of shared
weights step their one-token LLM forwards together (:mod:`engine.backbones.minicpmo45.rounds`).

At admission a session whose backbone replays graphs over demand stores joins a group of up to ``slots`` members
of the same LLM (its LLM store first moved into one with a sink, ``ensure_llm_sink``; its one-token forwards are
then routed to the group's rounds); at close, or before a second whose toggles change, it leaves. Membership changes run under the host's exclusive gate, so no round is in flight. A
group of ``n`` members steps together only where the start-up check passed at ``n`` on this device
(:func:`~engine.backbones.minicpmo45.group_graphs.check`, captured, with a member sitting the round out); the GEMMs'
row verdicts (:func:`~engine.backbones.minicpmo45.group_graphs.check_rows`) are made once per LLM. A member takes
part only in a shared second; in any other it steps alone, with the same bits.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch

if TYPE_CHECKING:
    from .host import EngineHost
    from .session import HostedSession

#: the history room of the check's stores (its histories are 3-40 positions)
CHECK_ROOM = 64


class LLMRoundsHost:
    """Groups of :class:`~engine.backbones.minicpmo45.rounds.LLMRounds`, one LLM each, up to ``slots`` members."""

    def __init__(self, host: "EngineHost", slots: int = 8, wait_s: float = 0.002):
        self.host, self.slots, self.wait_s = host, int(slots), float(wait_s)
        self.groups: List[object] = []
        self._verdicts: Dict[int, object] = {}
        self._checked: Dict[Tuple[int, int], Tuple[bool, str]] = {}

    def ineligible(self, backbone) -> Optional[str]:
        """Why a session's backbone cannot take part (None: it can)."""
        from engine.backbones.minicpmo45.backbone import MiniCPMO45Backbone
        if self.host.device.type != "cuda":
            return "LLM rounds need CUDA graph replay (on the CPU every second runs exclusively, alone)"
        if self.host.launch != "threads":
            return "LLM rounds need launch='threads' (members meet from their own threads)"
        if not isinstance(backbone, MiniCPMO45Backbone):
            return f"the {type(backbone).__name__} has no LLM rounds (MiniCPM-o 4.5 only)"
        t = backbone.toggles()
        if not (t.get("graph_replay") and t.get("demand_sized")):
            return "the session does not replay graphs over demand stores: it steps alone"
        return None

    def prepare(self, hosted: "HostedSession") -> None:
        """Before the session joins, beside the other sessions' seconds (the shared gate, not the exclusive one the
        join takes): the GEMM row verdicts of its LLM and the device's check of the group step at the size its group
        will have, so the join finds both made. Each takes the device a second or two at the released sizes; made
        inside the join they would hold every session's second meanwhile."""
        bb = hosted.session.backbone
        if self.ineligible(bb) is not None:
            return
        verdicts = self._verdicts_for(bb)
        group = self._open_group(bb)
        n = len(group.members) + 1 if group is not None else 1
        if n >= 2:
            self._check(bb, verdicts, n)

    # -- membership (under the host's exclusive gate) ------------------------------------------------
    def join(self, hosted: "HostedSession") -> str:
        bb = hosted.session.backbone
        why = self.ineligible(bb)
        if why is not None:
            return why
        if not bb.ensure_llm_sink():                # its store moved into one with a sink (graphs recaptured)
            return "the session's LLM store is not a demand store: it steps alone"
        group = self._open_group(bb)
        if group is None:
            group = self._group(bb)
            self.groups.append(group)
        note = group.join(hosted.id, bb.kv_llm, bb.own_forward, lambda h=hosted: h.in_shared_second)
        bb.rounds, bb.round_key = group, hosted.id
        hosted.llm_rounds = group
        return note

    def leave(self, hosted: "HostedSession") -> None:
        group = getattr(hosted, "llm_rounds", None)
        if group is None:
            return
        group.leave(hosted.id)
        bb = hosted.session.backbone
        bb.rounds, bb.round_key, hosted.llm_rounds = None, None, None
        if not group.members:
            self.groups.remove(group)

    def _open_group(self, bb):
        """The group a session of ``bb``'s LLM joins: the first of that LLM with a free slot (None: a new one)."""
        return next((g for g in self.groups if g.llm is bb.llm and len(g.members) < self.slots), None)

    def _verdicts_for(self, bb):
        """The GEMM row verdicts of ``bb``'s LLM at 1..slots rows (made once per LLM)."""
        from engine.backbones.minicpmo45.group_graphs import check_rows
        key = id(bb.llm)
        if key not in self._verdicts:
            with torch.no_grad():
                self._verdicts[key] = check_rows(bb.llm, range(1, self.slots + 1))
        return self._verdicts[key]

    def _group(self, bb):
        from engine.backbones.minicpmo45.rounds import LLMRounds
        verdicts = self._verdicts_for(bb)
        return LLMRounds(bb.llm, self.host.device, verdicts, lambda n, _bb=bb: self._check(_bb, verdicts, n),
                         slots=self.slots, wait_s=self.wait_s)

    def _check(self, bb, verdicts, n: int) -> Tuple[bool, str]:
        """The group step of ``n`` members on this device (made once per LLM and size), one sitting out."""
        from engine.backbones.minicpmo45.group_graphs import check
        from engine.backbones.minicpmo45.kv import make_store
        key = (id(bb.llm), int(n))
        if key not in self._checked:
            d, region = bb.dims.llm, bb.llm_regions[0]
            fresh = lambda: make_store(True, region, d.layers, CHECK_ROOM, bb.device, sink=True)   # noqa: E731
            with torch.no_grad():
                self._checked[key] = check(bb.llm, fresh, bb.device, int(n), verdicts,
                                           graphs=bb.device.type == "cuda", seed=int(n),
                                           absent=[int(n) - 1] if n > 2 else [])
        return self._checked[key]

    def report(self) -> List[Dict[str, object]]:
        return [g.report() for g in self.groups]
