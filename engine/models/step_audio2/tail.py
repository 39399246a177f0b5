"""The Step-Audio2 decoder tail as the duplex session sees it: 25 tokens a second in, 24 kHz audio out.

A step runs once a chunk's 25 new tokens and 3 of lookahead are there (the duplex loop calls the stock
``stream`` with 28 tokens as soon as it has them) and consumes the 25; ``flush`` decodes whatever is left
as the last chunk. The first push of a stream returns nothing (its lookahead is still missing); each later
second returns one second of audio. The stream glue is :class:`~engine.tail.EngineTail`'s; the hooks here
give the chunk schedule, the voice prompt and the seeding of :mod:`.stream`.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch

from engine.core import SessionSpec, StepPlan
from engine.core.toggles import Toggles
from engine.fastpath import Verdict
from engine.tail import EngineTail, TailInfo

from .config import LOOKAHEAD, SAMPLE_RATE, SILENCE_TOKEN, TOKEN_RATE
from .model import StepAudio2Token2Wav
from .stream import Prompt, flow_noise


class StepAudio2Tail(EngineTail):
    """One model, one voice prompt; each :meth:`start` begins a fresh stream (open-ended plan)."""

    lookahead = LOOKAHEAD

    def __init__(self, model: StepAudio2Token2Wav, prompt: Prompt, size: str, synthetic: bool,
                 mode: str = "graphs"):
        self.prompt = prompt.to(model.device)
        info = TailInfo(name="step-audio2", title="Step-Audio2 token2wav (Step-Audio-2-mini)",
                        sample_rate=SAMPLE_RATE, token_rate=float(TOKEN_RATE), codebooks=1,
                        vocab=model.cfg.flow.vocab_size, size=size, synthetic_weights=synthetic)
        if model.device.type == "cuda":
            # the HiFT's transposed convs may otherwise get atomics-based cuDNN algorithms that do not repeat
            # their own bits: every mode must give the same bits (a process-wide setting, as in stream.py)
            torch.backends.cudnn.deterministic = True
        super().__init__(model, info, model.device, Toggles.from_mode(mode))

    @torch.no_grad()
    def start(self, seed: int = 0) -> None:
        """New stream: the faster paths are checked first (once per process and length, see ``checked``), for a
        stream cut into short chunks (``chunking``) at every chunk length too."""
        self.model.check_fast_paths(self.prompt.frames, short_chunks=self.chunking is not None)
        super().start(seed)

    def fast_paths(self) -> List[Verdict]:
        """The self-check's verdicts for this decoder (DiT, then HiFT; empty before :meth:`start`)."""
        return self.model.verdicts()

    # -- hooks -------------------------------------------------------------------------------------------
    def session_spec(self, steps: Optional[int] = None, last_frames: Optional[int] = None) -> SessionSpec:
        return self.model.spec(self.prompt.frames, steps, last_frames)

    def frames_in(self, sp: StepPlan) -> int:
        """New tokens a chunk consumes (25; the last chunk's are all that remain)."""
        return sp.advances["mel"] // self.model.flow.up_rate

    def check_tokens(self, tokens) -> torch.Tensor:
        t = tokens if isinstance(tokens, torch.Tensor) else torch.as_tensor(np.asarray(tokens))
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
            raise ValueError(f"speech tokens must be integers, got {t.dtype}")
        t = t.reshape(1, -1).to("cpu", torch.int64)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.info.vocab):
            raise ValueError(f"speech tokens must be in [0, {self.info.vocab})")
        return t

    def step_inputs(self, chunk: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"tokens": chunk.to(self.device)}

    def seed_stream(self, seed: int) -> None:
        torch.manual_seed(int(seed))            # the HiFT's draws come in the stock's order from here

    def prefill(self, seed: int) -> Dict[str, torch.Tensor]:
        p = self.prompt
        return {"tokens": p.tokens, "mel": p.mel, "spk": p.spk, "noise": flow_noise(seed).to(self.device)}

    def zero_codes(self) -> torch.Tensor:
        return torch.tensor([SILENCE_TOKEN], dtype=torch.int64)

    def shared_weights(self) -> Dict[str, object]:
        """What another stream of the same weights can be built around (``make_tail(shared=...)``): the
        model is read-only while streaming (constants are folded at load), the prompt is copied per stream."""
        return {"model": self.model, "prompt": self.prompt}
