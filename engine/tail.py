"""Decoder tails as the duplex session sees them: speech tokens in, 24 kHz audio out.

Each engine decoder (Step-Audio2 token2wav, Mimi) provides a :class:`DecoderTail` subclass that
hides its stream bookkeeping (lookahead, cross-fades, frames per second) behind ``push``. The
optimization toggles go straight to the tail's :class:`~engine.core.executor.Executor` and take
effect at the next step; every mode produces the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch


@dataclass
class TailInfo:
    name: str               # registry name: "step-audio2", "mimi"
    title: str              # for people: "Step-Audio2 token2wav (MiniCPM-o 4.5)"
    sample_rate: int        # output audio rate (24000)
    token_rate: float       # speech tokens (frames) per second of audio: 25 or 12.5
    codebooks: int          # tokens per frame (1 for Step-Audio2, 8/32 for Mimi)
    vocab: int              # token ids are in [0, vocab)
    size: str               # "released" | "tiny"
    synthetic_weights: bool # True when the weights are seeded random (no real voice)


class DecoderTail:
    """Base class: one streaming session of a decoder tail on the engine."""

    info: TailInfo

    def start(self, seed: int = 0) -> None:
        """Begin a new stream (plan, arena, executor; prompt prefill). Resets everything."""
        raise NotImplementedError

    def push(self, tokens: torch.Tensor) -> np.ndarray:
        """Feed the speech tokens of one second (int64, shape (codebooks, n)); return the float32
        audio that became ready (any length, possibly 0 while a lookahead fills)."""
        raise NotImplementedError

    def flush(self) -> np.ndarray:
        """End of stream: decode whatever is buffered (the last chunk)."""
        return np.zeros(0, dtype=np.float32)

    def set_toggles(self, demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> None:
        raise NotImplementedError

    def toggles(self) -> Dict[str, bool]:
        """The toggles in effect (graph replay reads False where there is no CUDA)."""
        raise NotImplementedError

    def state_bytes(self) -> int:
        """Bytes the tail's state arena holds now."""
        raise NotImplementedError

    def silence_tokens(self, n: int) -> torch.Tensor:
        """Tokens that decode to (near) silence, for seconds when the model listens."""
        raise NotImplementedError
