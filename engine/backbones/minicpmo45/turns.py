"""Who decides listen or speak: the LLM itself, or the labelled voice-activity turn policy.

With seeded random weights the LLM's ``<|listen|>`` / ``<|speak|>`` choice is a coin toss, so the
conversation would never look like one. :class:`VoiceActivityTurns` (the default without a
checkpoint) forces the *decision token* from voice activity instead: listen while the user talks,
answer in the pause (as long as the user's turn, at most ``reply_seconds``), and end the reply with
``<|turn_eos|>`` in its last second; a user who talks over the reply ends it at once (barge-in).
Everything after ``<|speak|>`` is still the LLM's own sampling, and every stage runs as it would in
a real conversation. :class:`ModelTurns` leaves the decision to the LLM (a real checkpoint).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from engine.backbones.policy import SPEAK, TurnPolicy


@dataclass(frozen=True)
class TurnDecision:
    """``forced``: "listen" / "speak" / None (the LLM samples its decision token);
    ``last``: this speaking second ends the reply (``<|turn_eos|>`` is forced before the unit ends)."""

    forced: Optional[str]
    last: bool = False


class ModelTurns:
    """The LLM decides (the stock behaviour with a real checkpoint), after ``listen_first`` seconds forced
    to listen: the MiniCPM-o-Demo server's start-up guard (``force_listen_count``, 3 by default there)."""

    max_turn_seconds: Optional[int] = None

    def __init__(self, listen_first: int = 3):
        self.listen_first = int(listen_first)
        self.label = f"model (the first {self.listen_first} s listen)" if self.listen_first else "model"
        self.seconds = 0

    def decide(self, user_speech: bool) -> TurnDecision:
        self.seconds += 1
        return TurnDecision("listen" if self.seconds <= self.listen_first else None)


class VoiceActivityTurns:
    """The decision token, and ``<|turn_eos|>`` at a reply's end, forced from voice activity (labelled: not the
    model's own turn-taking)."""

    label = ("voice-activity (forced: <|listen|> / <|speak|> as each second's first token, <|turn_eos|> in a "
             "reply's last second; the rest is sampled)")

    def __init__(self, reply_seconds: int = 4):
        self.policy = TurnPolicy(reply_seconds)
        self.max_turn_seconds = int(reply_seconds)

    def decide(self, user_speech: bool) -> TurnDecision:
        if self.policy.decide(user_speech) != SPEAK:
            return TurnDecision("listen")
        return TurnDecision("speak", last=self.policy.left == 0)


def make_turns(name: str, reply_seconds: int):
    if name == "voice-activity":
        return VoiceActivityTurns(reply_seconds)
    if name == "model":
        return ModelTurns()
    raise ValueError(f"unknown turn policy {name!r}; choose 'voice-activity' or 'model'")
