"""Mimi as a duplex-session decoder tail: codes in by the second, 24 kHz audio out.

The tail keeps 12.5 Hz frame bookkeeping: second ``k`` covers frames ``floor(12.5 k)`` to
``floor(12.5 (k+1)) - 1``, so seconds alternate 12 and 13 frames, starting with 12. ``push`` buffers
frames and runs one engine step (one graph replay) per complete second; ``flush`` decodes the
frames of a last, partial second eagerly and ends the stream.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import numpy as np
import torch

from engine.core.toggles import Toggles
from engine.fastpath import Verdict
from engine.tail import EngineTail, TailInfo

from . import weights as W
from .config import MimiConfig, preset
from .fastpaths import choose
from .model import MimiDecoder

log = logging.getLogger("engine.mimi")


def build_model(size: str = "released", device="cpu", seed: int = 0, checkpoint: Optional[str] = None,
                cfg: Optional[MimiConfig] = None, **order) -> MimiDecoder:
    """A MimiDecoder on ``device`` with checkpoint weights, or seeded random ones at ``size``.

    ``order``: ``layer_major`` / ``batch_matmul`` / ``batch_conv`` (see :class:`MimiDecoder`).
    """
    cfg = cfg or preset(size)
    state = W.load_checkpoint(checkpoint, cfg) if checkpoint else W.random_state(cfg, seed)
    return MimiDecoder(cfg, **order).to(device).load_moshi_state(state, source=checkpoint or f"random seed {seed}")


def check_codes(tokens, num_codebooks: int, bins: int) -> torch.Tensor:
    """Validate codes (codebooks x frames, integers in [0, bins)) and return them as int64 on the CPU."""
    t = torch.as_tensor(np.asarray(tokens) if not isinstance(tokens, torch.Tensor) else tokens)
    if t.dim() != 2 or t.shape[0] != num_codebooks:
        raise ValueError(f"Mimi codes must be (codebooks={num_codebooks}, frames), got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"Mimi codes must be integers, got {t.dtype}")
    t = t.to("cpu", torch.int64)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= bins):
        raise ValueError(f"Mimi codes must lie in [0, {bins}), got values in [{int(t.min())}, {int(t.max())}]")
    return t


class MimiTail(EngineTail):
    """One streaming session of the Mimi decoder on the engine (the glue is :class:`EngineTail`'s)."""

    def __init__(self, model: MimiDecoder, device, num_codebooks: int = 8, size: str = "released",
                 synthetic_weights: bool = True, demand_sized: bool = True, graph_replay: Optional[bool] = None):
        cfg = model.cfg
        if not cfg.n_q_semantic <= num_codebooks <= cfg.n_q:
            raise ValueError(f"num_codebooks must be in [{cfg.n_q_semantic}, {cfg.n_q}], got {num_codebooks}")
        self.cfg = cfg
        self.num_codebooks = int(num_codebooks)
        info = TailInfo(name="mimi", title="Mimi decoder (Moshi, Hibiki, Sesame CSM)",
                        sample_rate=cfg.sample_rate, token_rate=cfg.frame_rate, codebooks=self.num_codebooks,
                        vocab=cfg.bins, size=size, synthetic_weights=synthetic_weights)
        asked = Toggles(bool(demand_sized), True if graph_replay is None else bool(graph_replay))
        super().__init__(model, info, device, asked.on(device) if graph_replay is None else asked)

    def example_inputs(self, sp) -> Dict[str, torch.Tensor]:
        return self.model.example_inputs(sp, self.device, self.num_codebooks)

    @torch.no_grad()
    def start(self, seed: int = 0) -> None:
        """New stream: the faster orders are checked here first (once per process, see ``fastpaths``)."""
        self._verdicts = choose(self.model, self.device, self.num_codebooks)
        for v in self._verdicts:
            log.info("mimi fast path %s", v.line())
        super().start(seed)

    def fast_paths(self) -> List[Verdict]:
        """The self-check's verdicts for this stream (empty before :meth:`start`)."""
        return list(getattr(self, "_verdicts", []))

    def check_tokens(self, tokens) -> torch.Tensor:
        return check_codes(tokens, self.num_codebooks, self.cfg.bins)

    def zero_codes(self) -> torch.Tensor:
        """Codes of an all-zero latent (each RVQ part encodes 0: nearest codebook vector to the residual)."""
        return zero_latent_codes(self.model.rvq.codebooks.cpu(), self.cfg.n_q_semantic, self.num_codebooks)

    def shared_weights(self) -> Dict[str, object]:
        """The decoder module, read-only while streaming: another stream can be built around it."""
        return {"model": self.model}


def zero_latent_codes(codebooks: torch.Tensor, n_semantic: int, k: int) -> torch.Tensor:
    """RVQ encoding of a zero vector: the semantic and acoustic parts each start from residual 0."""
    out = []
    for lo, hi in ((0, n_semantic), (n_semantic, k)):
        residual = torch.zeros(codebooks.shape[-1])
        for j in range(lo, hi):
            idx = int(torch.cdist(residual[None], codebooks[j])[0].argmin())
            out.append(idx)
            residual = residual - codebooks[j, idx]
    return torch.tensor(out, dtype=torch.int64)


def make_tail(size: str = "released", device="cpu", seed: int = 0, checkpoint: Optional[str] = None,
              num_codebooks: int = 8, demand_sized: bool = True, graph_replay: Optional[bool] = None,
              batch_conv: Optional[bool] = None, shared: Optional[dict] = None) -> MimiTail:
    """Registry hook: a Mimi tail with checkpoint weights, or seeded random ones at ``size``.

    ``batch_conv``: one cuDNN call per second for the non-transposed convs; None (default): where the
    start-up self-check finds it bit-identical to the reference order on this GPU (``fastpaths.py``).
    ``shared``: another tail's ``shared_weights()`` (same size/device/checkpoint/seed): nothing is loaded.
    """
    model = shared["model"] if shared is not None else \
        build_model(size, device, seed, checkpoint, batch_conv=batch_conv)
    return MimiTail(model, device, num_codebooks, size=size, synthetic_weights=checkpoint is None,
                    demand_sized=demand_sized, graph_replay=graph_replay)
