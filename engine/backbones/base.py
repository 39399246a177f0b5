"""The backbone interface: LISTEN (take in one second of the user) and THINK (speech tokens or not).

A backbone sits in front of a decoder tail and speaks its token format (codebooks, vocabulary,
frames per second), given as a :class:`TokenFormat`. Per second the session calls
:meth:`Backbone.listen` with the second's audio and voice activity, then :meth:`Backbone.think`
with the number of tail frames this second needs; THINK answers with a :class:`Thought`: the
decision (listen or speak) and the speech tokens it produced (kept on the device).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

import torch

from engine.core.toggles import Toggles

if TYPE_CHECKING:
    from engine.fastpath import Verdict
    from engine.vad import VadResult



@dataclass(frozen=True)
class TokenFormat:
    """What the decoder tail reads: ``codebooks`` rows of ids in ``[0, vocab)`` at ``rate_hz``."""

    codebooks: int
    vocab: int
    rate_hz: float

    def frames_in_second(self, k: int) -> int:
        """Frames second ``k`` covers: frames floor(rate*k) .. floor(rate*(k+1)) - 1 (12, 13, ... at 12.5 Hz)."""
        return int((self.rate_hz * (k + 1)) // 1) - int((self.rate_hz * k) // 1)


@dataclass
class BackboneInfo:
    """What a built backbone is, for people (its registry name, a title with its sizes and weights)."""

    name: str          # its registry name
    title: str         # for people
    synthetic: bool    # seeded random weights: real timing and memory, not real speech
    note: str = ""


@dataclass
class Thought:
    """THINK's answer for one second."""

    decision: str                          # "listen" | "speak"
    tokens: Optional[torch.Tensor]         # int64 (codebooks, n) on the device, or None (nothing to say)
    produced: int                          # speech tokens the decoder generated this second
    text: str = ""
    turn_end: str = ""                     # "end": the reply ended this second (the tail decodes what it
                                           # holds, then starts the next turn); "cut": the reply was cut
                                           # (barge-in: what the tail holds is dropped); "": neither
    llm_ids: Tuple[int, ...] = ()          # the backbone's LLM tokens this second, in order (where it has them)
    codes: Tuple[int, ...] = ()            # the speech codes its decoder drew this second (no silence prefix)


class Backbone:
    """Base class: LISTEN + THINK of one duplex session (each registered backbone package has one).

    What a backbone offers beyond LISTEN and THINK is declared on its :class:`~engine.registry.BackboneEntry`
    (``force_listen``, ``stage_marks``, ``ahead``, ``system_prompt``...); the methods here are what a declared
    trait calls, and the session calls one only where its entry declares it."""

    info: BackboneInfo
    #: the session's stage clock (``StageClock.mark``), set each second where the entry declares ``stage_marks``
    stage_mark: Optional[Callable[[str], None]] = None

    def start(self) -> None:
        """Build the streaming state (and capture graphs when graph replay is on)."""
        raise NotImplementedError

    def listen(self, audio: torch.Tensor, vad: VadResult) -> None:
        """Take in one second of user audio: float32 (24000,) on the session's device."""
        raise NotImplementedError

    def think(self, frames: int) -> Thought:
        """Decide and, when speaking, produce ``frames`` frames of speech tokens."""
        raise NotImplementedError

    def set_toggles(self, toggles: Toggles) -> None:
        """Engine toggles, effective from the next step; the tokens never change (a backbone that runs
        outside the engine ignores them)."""

    def toggles(self) -> Toggles:
        """The toggles in effect; a backbone that runs outside the engine runs as its stock does."""
        return Toggles(demand_sized=False, graph_replay=False)

    def state_bytes(self) -> int:
        """Bytes of streaming state the backbone holds (KV caches)."""
        return 0

    def horizon_bytes(self, seconds: float) -> int:
        """Bytes of streaming state the backbone will hold after ``seconds`` of a session at the worst case its
        clocks declare (what a host admits a session for); its state now by default (nothing grows)."""
        return int(self.state_bytes())

    def batch_runner(self, kind: str, group: object):
        """The runner of a batched step this backbone declares (a device's scheduler asks the first session that
        parks at one): an object with ``run(members, payloads) -> results``, ``prepare(member)`` and
        ``leave(member)``. None declared by default."""
        from engine.core.yieldpoints import NotBatched
        raise NotBatched(kind)

    def close(self) -> None:
        """Release what the backbone holds."""

    def fast_paths(self) -> List["Verdict"]:
        """The start-up self-check's verdicts on this backbone's optional faster paths (:mod:`engine.fastpath`),
        for the session info; none by default."""
        return []

    def force_listen(self) -> None:
        """The next second listens whatever the backbone would decide, closing a reply that is open (entries
        that declare ``force_listen``)."""
        raise NotImplementedError(f"{type(self).__name__} takes no forced listen of its own")

    def prepare_ahead(self, scope: str, stop: Optional[Callable[[], bool]] = None) -> int:
        """Between seconds, off the clock: prepare what the next second runs within ``scope`` (one of the
        entry's ``ahead``); ``stop`` is asked between pieces of work. Returns the pieces made (captures)."""
        return 0

    def shared_weights(self) -> Optional[Dict[str, object]]:
        """Read-only modules another session's backbone can be built around (``make_backbone(shared=)``);
        None when this backbone cannot share its weights."""
        return None


def make_backbone(name: str, fmt: TokenFormat, *, size: str, device, seed: int = 0,
                  checkpoint: Optional[str] = None, demand_sized: bool = True, graph_replay: bool = True,
                  reply_seconds: int = 4, debug: bool = False, shared: Optional[Dict[str, object]] = None) -> Backbone:
    """Build the registered backbone ``name`` for a tail reading ``fmt`` (its package imports what it needs
    only now). ``shared``: another backbone's ``shared_weights()`` (same name, size, device, checkpoint, seed)."""
    from engine import registry
    return registry.get_backbone(name).make(fmt, size=size, device=device, seed=seed, checkpoint=checkpoint,
                                            demand_sized=demand_sized, graph_replay=graph_replay,
                                            reply_seconds=reply_seconds, debug=debug, shared=shared)
