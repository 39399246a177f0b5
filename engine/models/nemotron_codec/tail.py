"""The codec as a duplex-session decoder tail: 31 codebooks at 12.5 Hz in, 22.05 kHz audio out.

The session resamples the tail's rate to its own (``engine.session.session.RateConverter``). All the
stream bookkeeping is :class:`~engine.tail.EngineTail`'s: one engine step (one graph replay) per
complete second of frames, a short last second through a finite plan. Each new stream first lets the
start-up self-check decide which library calls run once per second (:mod:`.fastpaths`).
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch

from engine.core import StepPlan
from engine.core.toggles import Toggles, graphs_can_run
from engine.fastpath import Verdict
from engine.tail import EngineTail, TailInfo

from . import weights as W
from .config import CodecConfig, preset
from .fastpaths import choose
from .model import NemotronCodecDecoder

log = logging.getLogger("engine.nemotron_codec")
NAME = "nemotron-codec"
TITLE = "Nemotron VoiceChat EAR-TTS codec (causal ConvNeXt + iSTFT)"


def build_model(size: str = "released", device="cpu", seed: int = 0, checkpoint: Optional[str] = None,
                cfg: Optional[CodecConfig] = None, **options) -> NemotronCodecDecoder:
    """The decoder on ``device`` with a checkpoint folder's weights, or seeded random ones at ``size``.

    ``options``: ``pointwise_per_frame`` / ``batched`` (see :class:`NemotronCodecDecoder`)."""
    if checkpoint:
        from .checkpoint import load
        cfg, state = load(checkpoint)
    else:
        cfg = cfg or preset(size)
        state = W.random_state(cfg, seed)
    model = NemotronCodecDecoder(cfg, **options)
    W.load_into(model, W.check_state(state, cfg, checkpoint or f"random seed {seed}"))
    return model.to(device)


def zero_latent_codes(codebooks: torch.Tensor) -> torch.Tensor:
    """Residual quantization of the zero latent: at each depth, the codebook vector nearest the residual."""
    residual = torch.zeros(codebooks.shape[-1], dtype=codebooks.dtype)
    out = []
    for book in codebooks:
        idx = int(torch.cdist(residual[None], book)[0].argmin())
        out.append(idx)
        residual = residual - book[idx]
    return torch.tensor(out, dtype=torch.int64)


class NemotronCodecTail(EngineTail):
    """One streaming session of the codec decoder on the engine."""

    def __init__(self, model: NemotronCodecDecoder, device, size: str = "released", synthetic_weights: bool = True,
                 toggles: Optional[Toggles] = None):
        cfg = model.cfg
        info = TailInfo(name=NAME, title=TITLE, sample_rate=cfg.sample_rate, token_rate=cfg.frame_rate,
                        codebooks=cfg.num_quantizers, vocab=cfg.codebook_size, size=size,
                        synthetic_weights=synthetic_weights)
        if torch.device(device).type == "cuda":
            # cuDNN's transposed convs may otherwise pick atomics-based algorithms that do not repeat their
            # own bits; TF32 stays off, as the stock decode runs it (a process-wide setting, like Step-Audio2's)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.allow_tf32 = False
        super().__init__(model, info, device, toggles)

    @torch.no_grad()
    def start(self, seed: int = 0) -> None:
        """New stream: the batched calls are checked here first (once per process, see ``fastpaths``)."""
        self._verdicts = choose(self.model, self.device)
        for v in self._verdicts:
            log.info("nemotron-codec fast path %s", v.line())
        super().start(seed)

    def fast_paths(self) -> List[Verdict]:
        """The self-check's verdicts for this stream (empty before :meth:`start`)."""
        return list(getattr(self, "_verdicts", []))

    def frames_in(self, sp: StepPlan) -> int:
        return self.model.frames_in(sp)

    def zero_codes(self) -> torch.Tensor:
        """The codes of a zero latent (nemo derives its silence frame with the encoder, which is not loaded)."""
        return zero_latent_codes(self.model.codebooks.detach().cpu())


def make_tail(size: str = "released", device="cpu", seed: int = 0, checkpoint: Optional[str] = None,
              demand_sized: bool = True, graph_replay: Optional[bool] = None, shared: Optional[Dict] = None,
              cfg: Optional[CodecConfig] = None, **options) -> NemotronCodecTail:
    """Registry hook: a codec tail with a checkpoint folder's weights, or seeded random ones at ``size``.

    ``shared``: another tail's ``shared_weights()`` (same size/device/checkpoint/seed): nothing is loaded."""
    model = shared["model"] if shared is not None else build_model(size, device, seed, checkpoint, cfg, **options)
    if graph_replay is None:
        graph_replay = graphs_can_run(device)
    return NemotronCodecTail(model, device, size="checkpoint" if checkpoint else size,
                             synthetic_weights=checkpoint is None,
                             toggles=Toggles(bool(demand_sized), bool(graph_replay)))
