"""One rehearsed second before the first real one: every eager path of LISTEN and THINK run once, on scratch.

A CUDA kernel's first launch in a process costs more than its later ones: the driver loads its module (lazy
loading is CUDA's default), and the libraries pick and cache their configurations for the shapes. The graphs a
session captures at start run their kernels once (the warm-ups), but the eager work between and around them —
attention between the layer graphs, the logits of a feed, the text sampler, the TTS's condition and the code
sampler — first runs in a real second. On the H200 the first second took 147 ms against ~30 and the
first speaking second's THINK 180–290 ms against ~110, with no capture in either.

:func:`rehearse` runs LISTEN (a reply's close, ``<unit>``, a second of random audio embeddings) and a speaking
THINK (the decision forced to speak, the sampled slots, the TTS's prefill and its 26 steps) through the
protocol, then puts back everything they touched: the stores' lengths (what they wrote lies past the
history, where the real seconds write again before anything reads it), the protocol's fields, the sampler's
history and every random-number state a draw takes. Only over demand stores: a stock store's rows would stay.
"""
from __future__ import annotations

from typing import Optional

import torch

from engine.core.graphs import session_generator

from .turns import TurnDecision


def can_rehearse(protocol, llm_worst: int, tts_worst: int) -> bool:
    """Whether both stores are demand stores with room for a worst-case second past their histories."""
    a, b = protocol.kv_llm, protocol.kv_tts
    return (a.kind == "demand" and b.kind == "demand" and a.length + llm_worst <= a.capacity
            and b.length + tts_worst <= b.capacity)


def rehearse(protocol, audio_tokens: int, device: torch.device) -> Optional[str]:
    """Run a listening and a speaking second's eager paths once on scratch and put the state back; returns
    what ran ("listen+speak"), or None where the stores are not demand stores."""
    p = protocol
    if p.kv_llm.kind != "demand" or p.kv_tts.kind != "demand":
        return None
    saved = (p.pending_close, p.logits, p.turn_ended, list(p.sampler.history), p.tap)
    rng = _RandomStates(device)
    p.tap = None                                     # the bench's digests see real seconds only
    try:
        with torch.no_grad(), p.kv_llm.rehearsal(), p.kv_tts.rehearsal():
            t = p.d.tokens
            p.pending_close = [t.chunk_eos, t.unit_end]
            hidden = p.llm.model.embed_tokens.weight
            emb = torch.randn(audio_tokens, hidden.shape[1], device=device, dtype=torch.float32) * 0.02
            p.prefill(emb.to(hidden.dtype))
            unit, text_hidden = p.decode(TurnDecision("speak"))
            unit.end_of_turn = False                 # keep the TTS history (none at start; a real one later)
            p.speak(unit, text_hidden)
    finally:
        p.pending_close, p.logits, p.turn_ended, p.sampler.history, p.tap = saved
        rng.restore()
    return "listen+speak"


class _RandomStates:
    """The CPU's, the device's default and the session's own generator states, put back after the draws."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        self.own = session_generator(self.device)
        self.own_state = self.own.get_state() if self.own is not None else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)
        if self.own is not None:
            self.own.set_state(self.own_state)
