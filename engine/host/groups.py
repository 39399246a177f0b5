"""Groups of hosted sessions whose LISTEN steps replay as one batched graph (the host's opt-in mode).

Sessions join a group at admission (up to ``slots`` per group, same shared decoder weights); the
group's batched graph is captured again whenever its members change, under the host's exclusive
gate. Each member's backbone ``listen`` is routed here: the member computes its ten embeddings on
its own stream and joins the group's open *round*. When every member has joined, the last one to
arrive runs the ten batched steps (waiting on each member's embeddings, on its own stream) and
releases the others, whose streams wait for the result. A round that does not fill within
``wait_s`` (a member late, or in an exclusive second) is cancelled and every member present steps
its own graphs, as alone — same bits either way, since the start-up check passed.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch

from engine.backbones.speech_decoder import SpeechDecoder

from .batched import SlotStepper, check

if TYPE_CHECKING:
    from .host import EngineHost
    from .session import HostedSession


@dataclass
class Round:
    """One second's LISTEN of a group: who has joined, and how it ended."""

    first: float
    items: Dict[int, Tuple[torch.Tensor, Optional["torch.cuda.Event"]]] = field(default_factory=dict)
    started: bool = False
    done: bool = False
    cancelled: bool = False
    error: str = ""
    event: Optional["torch.cuda.Event"] = None


class Group:
    """Members (in slot order) and their batched stepper."""

    def __init__(self, model: SpeechDecoder):
        self.model = model
        self.members: List["HostedSession"] = []
        self.stepper: Optional[SlotStepper] = None
        self.cv = threading.Condition()
        self.open: Optional[Round] = None
        self.batched_rounds = 0
        self.solo_rounds = 0


class ListenBatcher:
    """The host's batched LISTEN: the start-up check, groups, and the per-second rounds."""

    def __init__(self, host: "EngineHost", slots: int = 8, wait_s: float = 0.05):
        self.host = host
        self.slots = int(slots)
        self.wait_s = float(wait_s)
        self.groups: List[Group] = []
        self._checked: Dict[Tuple[int, int], Tuple[Optional[str], str]] = {}

    # -- eligibility ---------------------------------------------------------------------------------
    def ineligible(self, model: Optional[object]) -> Optional[str]:
        """Why sessions of a backbone decoder cannot batch here at all (None: they can, where checked)."""
        if self.host.device.type != "cuda":
            return "batched replay needs CUDA graph replay (on the CPU every second runs exclusively)"
        if self.host.launch != "threads":
            return "batched replay needs launch='threads' (members meet at LISTEN from their own threads)"
        if not isinstance(model, SpeechDecoder):
            return f"the backbone's decoder ({type(model).__name__}) has no batched step"
        return None

    def verdict(self, model: Optional[object], slots: Optional[int] = None) -> Tuple[Optional[str], str]:
        """(gemm or None, why) for a group of ``slots`` sessions (None: the most a group holds) of a backbone
        decoder: the batched step's kernels depend on the slot count, so each count is checked on this
        device (once per model) before a group of that size replays batched."""
        why = self.ineligible(model)
        if why is not None:
            return None, why
        n = self.slots if slots is None else int(slots)
        key = (id(model), n)
        if key not in self._checked:
            self._checked[key] = check(model, self.host.device, slots=n)
        return self._checked[key]

    # -- membership (called under the host's exclusive gate) ----------------------------------------
    def join(self, hosted: "HostedSession") -> str:
        """Put a freshly built session in a group (its listen is routed here); returns why/why not."""
        s = hosted.session
        model = getattr(s.backbone, "model", None)
        why = self.ineligible(model)
        toggles = s.backbone.toggles()
        if why is not None or not (toggles.get("graph_replay") and toggles.get("demand_sized")):
            return why or "the session does not replay graphs: it steps alone"
        group = next((g for g in self.groups if g.model is model and len(g.members) < self.slots), None)
        if group is None:
            group = Group(model)
            self.groups.append(group)
        group.members.append(hosted)
        hosted.group = group
        s.backbone.listen = lambda audio, vad, _h=hosted: self.listen(_h, audio, vad)
        return self._recapture(group)

    def leave(self, hosted: "HostedSession") -> None:
        group = getattr(hosted, "group", None)
        if group is None:
            return
        group.members.remove(hosted)
        hosted.group = None
        if not group.members:
            self.groups.remove(group)
            return
        self._recapture(group)

    def _recapture(self, group: Group) -> str:
        """The group's batched step for its members now, where the check passed at this slot count (else its
        members step their own graphs, the reference); why / why not."""
        group.stepper = None
        if len(group.members) < 2:
            return "one member steps its own graphs"
        gemm, why = self.verdict(group.model, len(group.members))
        if gemm is None:
            return why
        exs = [m.session.backbone.executor for m in group.members]
        rngs = [m.rng for m in group.members]
        stepper = SlotStepper(group.model, exs, rngs, self.host.device, gemm)
        if stepper.step_plans() is None:
            return "the members' next steps differ in shape: they step alone"
        stepper.capture()
        group.stepper = stepper
        return why

    # -- one second's LISTEN ---------------------------------------------------------------------------
    def listen(self, hosted: "HostedSession", audio: torch.Tensor, vad) -> None:
        bb = hosted.session.backbone
        emb = bb.listen_inputs(audio, vad)                   # [10, 1, 1, dim], on this member's stream
        group = getattr(hosted, "group", None)
        if group is None or group.stepper is None or not hosted.in_shared_second:
            return self._solo(bb, emb)
        cuda = self.host.device.type == "cuda"
        ready = torch.cuda.Event() if cuda else None
        if ready is not None:
            ready.record()
        leader, rnd = self._join_round(group, hosted, emb, ready)
        if leader:
            self._run_round(group, rnd)
        if rnd.cancelled:
            group.solo_rounds += 1
            return self._solo(bb, emb)
        if rnd.error:
            raise RuntimeError(f"batched LISTEN failed: {rnd.error}")
        if rnd.event is not None:
            torch.cuda.current_stream(self.host.device).wait_event(rnd.event)

    def _join_round(self, group: Group, hosted, emb, ready) -> Tuple[bool, Round]:
        with group.cv:
            rnd = group.open
            if rnd is None:
                rnd = group.open = Round(time.perf_counter())
            rnd.items[hosted.id] = (emb, ready)
            if len(rnd.items) == len(group.members):
                rnd.started, group.open = True, None
                return True, rnd
            end = rnd.first + self.wait_s
            while not (rnd.done or rnd.cancelled):
                left = end - time.perf_counter()
                if left <= 0 and not rnd.started:
                    rnd.cancelled = True
                    if group.open is rnd:
                        group.open = None
                    group.cv.notify_all()
                    break
                group.cv.wait(max(left, 0.001) if not rnd.started else 0.05)
            return False, rnd

    def _run_round(self, group: Group, rnd: Round) -> None:
        try:
            cuda = self.host.device.type == "cuda"
            stream = torch.cuda.current_stream(self.host.device) if cuda else None
            for _, ev in rnd.items.values():
                if ev is not None:
                    stream.wait_event(ev)
            embs = [rnd.items[m.id][0] for m in group.members]            # slot order
            for t in range(embs[0].shape[0]):
                group.stepper.replay(torch.cat([e[t] for e in embs], dim=0))   # [S, 1, dim]
            if cuda:
                rnd.event = torch.cuda.Event()
                rnd.event.record(stream)
            group.batched_rounds += 1
        except Exception as e:  # noqa: BLE001 - every member gets the message
            rnd.error = f"{type(e).__name__}: {e}"
        with group.cv:
            rnd.done = True
            group.cv.notify_all()

    @staticmethod
    def _solo(bb, emb: torch.Tensor) -> None:
        with torch.no_grad():
            for i in range(emb.shape[0]):
                bb.executor.step({"x": emb[i]})

    def report(self) -> List[Dict[str, int]]:
        return [{"members": len(g.members), "batched_rounds": g.batched_rounds, "solo_rounds": g.solo_rounds}
                for g in self.groups]
