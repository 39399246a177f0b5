"""Seeded sampling of the duplex LLM's tokens and the TTS's speech codes, by the stock duplex rules.

Text (one decode step of the LLM; ``logits`` [1, V] in the LLM's own dtype):

* a *decision draw* from softmax(logits) as they are; ``<|chunk_eos|>`` there ends the unit (the model keeps
  the say over when it stops) and nothing else is drawn;
* otherwise the *text draw*: the forbidden ids (``<|tts_pad|>``, the tokenizer's ``bad_token_ids`` and
  ``<|chunk_eos|>``) at -inf; each distinct id among the last 512 text draws divided by the repetition penalty
  (1.05); the ``<|turn_eos|>`` logit pushed away from zero-crossing by the length penalty (a positive one
  divided, any other multiplied); then temperature, the top-k keep-set (every logit not below the k-th
  largest) and the nucleus: walking the logits from the largest down (``torch.sort``'s descending order), a
  logit is dropped once the probability mass *before* it (a running ``torch.cumsum`` of the sorted softmax)
  exceeds p, so the token that crosses p stays. Only the decision draw can end the unit with
  ``<|chunk_eos|>``.

Speech codes (one TTS step; ``logits`` [1, C] float32): divided by the temperature (a [1, 1] float32 tensor,
as the stock holds it); after the first step each code's logit is scaled by ``penalty ** n`` for its ``n``
occurrences among this chunk's last 16 codes (a negative logit multiplied, any other divided); EOS at -inf
while fewer than the minimum codes are out; one draw.

Every draw is one category of a softmax by the exponential race (:func:`race`: ``argmax(p / E)``, ``E ~ Exp(1)``
drawn by ``exponential_``), which is how ``torch.multinomial`` draws one sample, on the device's default generator
(a hosted CUDA session's own state:
:func:`engine.core.graphs.session_generator`), in the stock's order, so a session
seeded before its first step repeats the stock's tokens bit for bit.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F

from engine.core import yieldpoints
from engine.core.graphs import session_generator
from engine.core.hostcopy import count_codes, device_ids

from .dims import Sampling, SpecialTokens


def keep_top_k(x: torch.Tensor, k: int) -> torch.Tensor:
    """-inf below the k-th largest logit of each row (ties with it stay)."""
    if k <= 0:
        return x
    kth = torch.topk(x, min(k, x.shape[-1]), dim=-1).values[..., -1:]
    return x.masked_fill(x < kth, float("-inf"))


def nucleus(x: torch.Tensor, p: float) -> torch.Tensor:
    """-inf for every logit reached after the descending running probability mass has passed ``p``."""
    if p <= 0.0:
        return x
    ranked, order = torch.sort(x, dim=-1, descending=True)
    mass = torch.cumsum(F.softmax(ranked, dim=-1), dim=-1)           # mass up to and including each rank
    past = F.pad(mass[..., :-1] > p, (1, 0), value=False)            # mass strictly before each rank > p
    return x.masked_fill(torch.zeros_like(past).scatter(-1, order, past), float("-inf"))


def top_k_top_p(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """The top-k keep-set, then the nucleus of mass ``p`` (see :func:`nucleus`)."""
    return nucleus(keep_top_k(logits, k), p)


def race(probs: torch.Tensor, generator=None) -> torch.Tensor:
    """One category per row of ``probs`` [..., C], drawn with probability proportional to it: every category
    races an exponential clock ``E ~ Exp(1)`` scaled by its probability, and the first home (the largest
    ``p / E``) wins -> int64 [..., 1].

    This is the draw ``torch.multinomial(probs, 1)`` makes: the same ``exponential_`` on a tensor of ``probs``'s
    shape from the same generator (so the same numbers, and the generator moves on by the same amount), the same
    quotient and argmax. What it leaves out is multinomial's validity check of ``probs`` (no inf, NaN or negative
    value, a positive sum): nine more kernels each draw, none of which changes the result."""
    clocks = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return torch.argmax(probs / clocks, dim=-1, keepdim=True)


class TextSampler:
    """The LLM's token choice; ``history`` holds the ids of the text draws (the repetition window)."""

    def __init__(self, s: Sampling, tokens: SpecialTokens, forbidden: Sequence[int]):
        self.s, self.t = s, tokens
        self.forbidden = sorted(set(int(i) for i in forbidden))
        self._forbidden_at: Dict[torch.device, torch.Tensor] = {}    # the ids on each device, made once
        self.history: List[int] = []

    def __call__(self, logits: torch.Tensor) -> int:
        """The stock's draw: one from the raw softmax (the decision), and unless that is ``<|chunk_eos|>`` a second
        from the filtered distribution. Both are launched before either is read, with the generator's state kept
        between them: where the decision ends the unit, the state goes back to right after it, as if the second
        draw had never run (one host read a step instead of two, the stock's numbers and generator state)."""
        dev = logits.device
        gen = session_generator(dev)
        decision = race(F.softmax(logits[0], dim=-1), gen)
        after_decision = draw_state(dev)
        x = self._penalised(logits.clone())
        x = top_k_top_p(x / self.s.temperature, self.s.top_k, self.s.top_p)
        text = race(F.softmax(x, dim=-1), gen)
        yieldpoints.wait()                       # under a scheduler: the others' work goes on while this is read
        first, tok = torch.cat([decision.view(1), text.view(1)]).tolist()
        if first == self.t.chunk_eos:
            set_draw_state(dev, after_decision)
            return first
        self.history.append(tok)
        return tok

    def _penalised(self, x: torch.Tensor) -> torch.Tensor:
        if self.forbidden:
            idx = self._forbidden_at.get(x.device)
            if idx is None:
                idx = self._forbidden_at[x.device] = device_ids(self.forbidden, x.device)
            x[:, idx] = float("-inf")
        penalty = self.s.repetition_penalty
        seen = sorted({t for t in self.history[-self.s.repetition_window:] if t < x.shape[-1]})
        if penalty != 1.0 and seen:
            ids = device_ids(seen, x.device)
            x[0, ids] = x[0, ids] / penalty if penalty > 1.0 else x[0, ids] * (1.0 / penalty)
        lp = self.s.length_penalty
        if lp != 1.0:
            te = self.t.turn_eos
            v = x[0, te]
            x[0, te] = torch.where(v > 0, v / lp, v * lp)        # both made, one kept: no host read of v
        return x


def text_sampler(s: Sampling, tokens: SpecialTokens, bad_token_ids: Sequence[int] = ()) -> TextSampler:
    """The duplex loop's text sampler: the stock's forbidden list, ``<|tts_pad|>`` and the tokenizer's
    ``bad_token_ids``, to which StreamDecoder's constructor adds ``<|chunk_eos|>`` (only the decision draw
    ends a unit with it)."""
    return TextSampler(s, tokens, forbidden=[tokens.tts_pad, *bad_token_ids, tokens.chunk_eos])


def code_logits(logits: torch.Tensor, codes: torch.Tensor, t: int, s: Sampling, eos: int, min_codes: int
                ) -> torch.Tensor:
    """The TTS step's logits after temperature, repetition penalty and the EOS rule.

    logits: [1, C] float32; codes: [steps] int64 on the device, the first ``t`` drawn this chunk."""
    x = logits / torch.full((1, 1), s.tts_temperature, dtype=torch.float32, device=logits.device)
    if t > 0 and s.tts_repetition_penalty != 1.0:
        window = codes[max(0, t - s.tts_repetition_window):t]
        count = count_codes(window, x.shape[-1], x.dtype)                                # [1, C]
        alpha = torch.pow(torch.full_like(count, s.tts_repetition_penalty), count)
        x = torch.where(x < 0, x * alpha, x / alpha)
    if t < min_codes:
        x[:, eos] = float("-inf")
    return x


def draw_state(device) -> torch.Tensor:
    """The state of the generator the draws on ``device`` take (the hosted session's own, else the device's
    default); read on the host, no device synchronization."""
    gen = session_generator(device)
    if gen is not None:
        return gen.get_state()
    dev = torch.device(device)
    return torch.cuda.get_rng_state(dev) if dev.type == "cuda" else torch.get_rng_state()


def set_draw_state(device, state: torch.Tensor) -> None:
    """Put back a state :func:`draw_state` read."""
    gen = session_generator(device)
    dev = torch.device(device)
    if gen is not None:
        gen.set_state(state)
    elif dev.type == "cuda":
        torch.cuda.set_rng_state(state, dev)
    else:
        torch.set_rng_state(state)


def draw(logits: torch.Tensor) -> torch.Tensor:
    """One draw from softmax(logits) [1, C] -> [1] int64 on the device (no host sync)."""
    return race(F.softmax(logits, dim=-1), session_generator(logits.device)).view(1)
