"""Seeded sampling of the duplex LLM's tokens and the TTS's speech codes (the stock duplex rules).

LLM, per decode step (``StreamDecoder.decode`` in MiniCPM-o-Demo, written here from its rules):

1. draw once from the raw softmax; if that draw is ``<|chunk_eos|>`` the unit ends there (the model
   keeps its own decision of when to stop);
2. otherwise: forbidden tokens (``<|tts_pad|>``, ``<|chunk_eos|>`` and the tokenizer's ``bad_token_ids``)
   to -inf; repetition penalty 1.05 on every distinct token among the last 512 drawn in step 3 (the logit
   is divided by it); a length penalty 1.1 that pushes ``<|turn_eos|>`` down (divide a positive logit,
   multiply a negative one); temperature 0.7, top-k 20, top-p 0.8; draw again.

TTS, per step: temperature 0.8; repetition penalty 1.05 per occurrence among the chunk's last 16
codes (``alpha = 1.05 ** count``: positive logits divided by it, negative ones multiplied); EOS
forbidden while fewer than the minimum codes are out; one draw. All draws come from the device's
default generator, so a seeded session repeats bit for bit.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F

from .dims import Sampling, SpecialTokens


def top_k_top_p(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """Keep the ``k`` largest logits (ties with the k-th too), then the smallest set whose probability
    reaches ``p`` (others -inf). logits: [1, V] float32.

    Reproducible on CUDA: ties keep their index order (stable sort), and the running probability mass is
    a product with a triangular matrix over the candidates only. ``torch.cumsum`` over a long CUDA row is
    a multi-block scan whose summation order can change from run to run, which moves the top-p boundary
    by an ulp and, at a near-tie, changes the token (seen on the H200 with the stock's formulation)."""
    out = logits.clone()
    if 0 < k < out.shape[-1]:
        kth = torch.topk(out, k, dim=-1).values[..., -1:]                   # [1, 1]
        out = out.masked_fill(out < kth, float("-inf"))
    if p < 1.0:
        vals, order = torch.sort(out, dim=-1, descending=True, stable=True)   # [1, V]
        probs = F.softmax(vals, dim=-1)
        n = int(torch.isfinite(vals).sum().item())                           # candidates lead the order
        tri = torch.ones(n, n, dtype=probs.dtype, device=probs.device).triu_()   # [n, n]: column j sums 0..j
        mass = probs[..., :n] @ tri                                          # [1, n] running mass
        drop = torch.zeros_like(vals, dtype=torch.bool)
        drop[..., 1:n] = mass[..., :-1] > p                                  # keep the token that crosses p
        out = out.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return out


class TextSampler:
    """The LLM's token choice; ``history`` holds the tokens drawn in the full (second-draw) path."""

    def __init__(self, s: Sampling, tokens: SpecialTokens, forbidden: Sequence[int]):
        self.s, self.t = s, tokens
        self.forbidden = sorted(set(int(i) for i in forbidden))
        self._forbidden_at: Dict[torch.device, torch.Tensor] = {}    # the ids on each device, made once
        self.history: List[int] = []

    def __call__(self, logits: torch.Tensor) -> int:
        # logits: [1, V] float32 of the last position
        first = int(torch.multinomial(F.softmax(logits[0], dim=-1), 1).item())
        if first == self.t.chunk_eos:
            return first
        s = self.s
        x = logits.clone()
        if self.forbidden:
            idx = self._forbidden_at.get(x.device)
            if idx is None:
                idx = self._forbidden_at[x.device] = torch.tensor(self.forbidden, dtype=torch.long, device=x.device)
            x[:, idx] = float("-inf")
        recent = self.history[-s.repetition_window:]
        if s.repetition_penalty != 1.0 and recent:
            ids = torch.tensor(sorted(set(t for t in recent if t < x.shape[-1])), dtype=torch.long, device=x.device)
            scale = s.repetition_penalty if s.repetition_penalty > 1.0 else 1.0 / s.repetition_penalty
            x[0, ids] = x[0, ids] / scale if s.repetition_penalty > 1.0 else x[0, ids] * scale
        if s.length_penalty != 1.0:
            te = self.t.turn_eos
            v = x[0, te]
            x[0, te] = torch.where(v > 0, v / s.length_penalty, v * s.length_penalty)
        x = top_k_top_p(x / s.temperature, s.top_k, s.top_p)
        tok = int(torch.multinomial(F.softmax(x, dim=-1), 1).item())
        self.history.append(tok)
        return tok


def code_logits(logits: torch.Tensor, codes: torch.Tensor, t: int, s: Sampling, eos: int, min_codes: int
                ) -> torch.Tensor:
    """The TTS step's logits after temperature, repetition penalty and the EOS rule.

    logits: [1, C] float32; codes: [steps] int64 on the device, the first ``t`` drawn this chunk."""
    x = logits / s.tts_temperature
    if t > 0 and s.tts_repetition_penalty != 1.0:
        window = codes[max(0, t - s.tts_repetition_window):t]
        count = torch.bincount(window, minlength=x.shape[-1]).to(x.dtype).view(1, -1)   # [1, C]
        alpha = torch.pow(torch.full_like(count, s.tts_repetition_penalty), count)
        x = torch.where(x < 0, x * alpha, x / alpha)
    if t < min_codes:
        x[:, eos] = float("-inf")
    return x


def draw(logits: torch.Tensor) -> torch.Tensor:
    """One draw from softmax(logits) [1, C] -> [1] int64 on the device (no host sync)."""
    return torch.multinomial(F.softmax(logits, dim=-1), 1).view(1)
