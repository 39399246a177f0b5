"""The Step-Audio2 decoder tail as the duplex session sees it: 25 tokens a second in, 24 kHz audio out.

``push`` buffers tokens until a chunk's 25 new + 3 lookahead are there (the duplex loop calls the stock
``stream`` with 28 tokens as soon as it has them), decodes every complete chunk and returns the audio that
became final; ``flush`` decodes whatever is left as the last chunk. The first push of a stream returns
nothing (its lookahead is still missing); each later second returns one second of audio.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch

from engine.core.toggles import requested
from engine.tail import DecoderTail, TailInfo

from .config import CHUNK_TOKENS, LOOKAHEAD, SAMPLE_RATE, SILENCE_TOKEN, TOKEN_RATE
from .model import StepAudio2Token2Wav
from .stream import Prompt, Session


class StepAudio2Tail(DecoderTail):
    """One model, one voice prompt; each :meth:`start` begins a fresh stream (open-ended plan)."""

    def __init__(self, model: StepAudio2Token2Wav, prompt: Prompt, size: str, synthetic: bool,
                 mode: str = "graphs"):
        self.model = model
        self.prompt = prompt
        self.info = TailInfo(name="step-audio2", title="Step-Audio2 token2wav (MiniCPM-o 4.5, Step-Audio-2-mini)",
                             sample_rate=SAMPLE_RATE, token_rate=float(TOKEN_RATE), codebooks=1,
                             vocab=model.cfg.flow.vocab_size, size=size, synthetic_weights=synthetic)
        self._flags: Dict[str, bool] = {"demand_sized": mode != "stock", "graph_replay": mode == "graphs"}
        self.session: Optional[Session] = None
        self._tokens: List[int] = []
        self._next = 0                      # first token of the next chunk

    def _mode(self) -> str:
        if not self._flags["demand_sized"]:
            return "stock"
        return "graphs" if self._flags["graph_replay"] else "demand"

    def start(self, seed: int = 0) -> None:
        self.session = Session(self.model, self.prompt, steps=None, mode=self._mode(), seed=seed)
        self._tokens, self._next = [], 0

    def _require(self) -> Session:
        if self.session is None:
            raise RuntimeError("call start() before pushing tokens")
        return self.session

    def push(self, tokens: torch.Tensor) -> np.ndarray:
        sess = self._require()
        t = torch.as_tensor(tokens).reshape(-1).tolist()
        if any(x < 0 or x >= self.info.vocab for x in t):
            raise ValueError(f"speech tokens must be in [0, {self.info.vocab})")
        self._tokens.extend(int(x) for x in t)
        out = []
        span = CHUNK_TOKENS + LOOKAHEAD
        while len(self._tokens) - self._next >= span:
            audio = sess.run(self._tokens[self._next:self._next + span])
            out.append(audio.float().cpu().numpy().reshape(-1))
            self._next += CHUNK_TOKENS
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def flush(self) -> np.ndarray:
        sess = self._require()
        rest = self._tokens[self._next:]
        if not rest:
            return np.zeros(0, dtype=np.float32)
        audio = sess.finish(rest).float().cpu().numpy().reshape(-1)
        self.session = None
        return audio

    def set_toggles(self, demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> None:
        self._flags.update(requested(demand_sized, graph_replay))
        if self.session is not None:
            self.session.executor.set_toggles(demand_sized=demand_sized, graph_replay=graph_replay)

    def toggles(self) -> Dict[str, bool]:
        if self.session is not None:
            return self.session.executor.toggles()
        cuda = self.model.device.type == "cuda"
        return {"demand_sized": self._flags["demand_sized"],
                "graph_replay": self._flags["graph_replay"] and cuda and self._flags["demand_sized"]}

    def state_bytes(self) -> int:
        return self.session.state_bytes() if self.session is not None else 0

    def silence_tokens(self, n: int) -> torch.Tensor:
        return torch.full((1, int(n)), SILENCE_TOKEN, dtype=torch.long)

    def shared_weights(self) -> Dict[str, object]:
        """What another stream of the same weights can be built around (``make_tail(shared=...)``): the
        model is read-only while streaming (constants are folded at load), the prompt is copied per stream."""
        return {"model": self.model, "prompt": self.prompt}
