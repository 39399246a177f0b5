"""Mimi as a duplex-session decoder tail: codes in by the second, 24 kHz audio out.

The tail keeps 12.5 Hz frame bookkeeping: second ``k`` covers frames ``floor(12.5 k)`` to
``floor(12.5 (k+1)) - 1``, so seconds alternate 12 and 13 frames, starting with 12. ``push`` buffers
frames and runs one engine step (one graph replay) per complete second; ``flush`` decodes the
frames of a last, partial second eagerly and ends the stream.
"""
from __future__ import annotations

import logging
from typing import Dict, Optional

import numpy as np
import torch

from engine.core import Executor, make_plan
from engine.core.toggles import requested
from engine.tail import DecoderTail, TailInfo

from . import weights as W
from .config import MimiConfig, preset
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


class MimiTail(DecoderTail):
    """One streaming session of the Mimi decoder on the engine."""

    def __init__(self, model: MimiDecoder, device, num_codebooks: int = 8, size: str = "released",
                 synthetic_weights: bool = True, demand_sized: bool = True, graph_replay: Optional[bool] = None):
        cfg = model.cfg
        if not cfg.n_q_semantic <= num_codebooks <= cfg.n_q:
            raise ValueError(f"num_codebooks must be in [{cfg.n_q_semantic}, {cfg.n_q}], got {num_codebooks}")
        self.model, self.cfg, self.device = model, cfg, torch.device(device)
        self.num_codebooks = int(num_codebooks)
        self.info = TailInfo(name="mimi", title="Mimi decoder (Moshi, Hibiki, Sesame CSM)",
                             sample_rate=cfg.sample_rate, token_rate=cfg.frame_rate, codebooks=self.num_codebooks,
                             vocab=cfg.bins, size=size, synthetic_weights=synthetic_weights)
        if graph_replay is None:
            graph_replay = self.device.type == "cuda"
        self._toggles = {"demand_sized": bool(demand_sized), "graph_replay": bool(graph_replay)}
        self.plan = make_plan(model.regions(), model.spec())
        self.executor: Optional[Executor] = None
        self._buf = torch.zeros((self.num_codebooks, 0), dtype=torch.int64)
        self._ended = False
        self._silence: Optional[torch.Tensor] = None

    # -- stream ----------------------------------------------------------------------------------
    @torch.no_grad()
    def start(self, seed: int = 0) -> None:
        """New stream: fresh state (Mimi's decode draws no random numbers; ``seed`` is unused)."""
        ex = Executor(self.model, self.plan, self.device, **self._toggles)
        ex.prepare_graphs(lambda sp: self.model.example_inputs(sp, self.device, self.num_codebooks))
        ex.init_state()
        self.executor = ex
        self._buf = torch.zeros((self.num_codebooks, 0), dtype=torch.int64)
        self._ended = False

    @property
    def seconds_done(self) -> int:
        return 0 if self.executor is None else self.executor.k

    def frames_needed(self) -> int:
        """Frames the next second takes (12 or 13)."""
        return self.plan.step(self.seconds_done).advances["frames"]

    @torch.no_grad()
    def push(self, tokens) -> np.ndarray:
        """Buffer ``tokens`` (codebooks, n) and decode every second that is complete."""
        self._require_stream()
        codes = check_codes(tokens, self.num_codebooks, self.cfg.bins)
        self._buf = torch.cat([self._buf, codes], dim=1)
        chunks = []
        while self._buf.shape[1] >= self.frames_needed():
            n = self.frames_needed()
            second, self._buf = self._buf[:, :n], self._buf[:, n:]
            out = self.executor.step({"codes": second.to(self.device)})["audio"]   # [1, 1, n * 1920]
            chunks.append(out.reshape(-1).cpu().numpy())
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    @torch.no_grad()
    def flush(self) -> np.ndarray:
        """Decode the buffered frames of a last, partial second (eagerly) and end the stream."""
        self._require_stream()
        self._ended = True
        if self._buf.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        codes, self._buf = self._buf.to(self.device), self._buf[:, :0]
        out = self.model.decode_frames(self.executor.state, codes)
        return out.reshape(-1).cpu().numpy()

    def _require_stream(self) -> None:
        if self.executor is None or self._ended:
            raise RuntimeError("no open Mimi stream: call start() first (flush() ends a stream)")

    # -- toggles and reporting ----------------------------------------------------------------------
    def set_toggles(self, demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> None:
        """Requested toggles apply from the next second (and to the next stream)."""
        self._toggles.update(requested(demand_sized, graph_replay))
        if self.executor is not None:
            self.executor.set_toggles(demand_sized=demand_sized, graph_replay=graph_replay)

    def toggles(self) -> Dict[str, bool]:
        if self.executor is None:
            return {"demand_sized": self._toggles["demand_sized"],
                    "graph_replay": self._toggles["graph_replay"] and self.device.type == "cuda"}
        return self.executor.toggles()

    def state_bytes(self) -> int:
        return 0 if self.executor is None else self.executor.state_bytes()

    def silence_tokens(self, n: int) -> torch.Tensor:
        """Codes of an all-zero latent (each RVQ part encodes 0: nearest codebook vector to the residual)."""
        if self._silence is None:
            self._silence = zero_latent_codes(self.model.rvq.codebooks.cpu(), self.cfg.n_q_semantic,
                                              self.num_codebooks)
        return self._silence[:, None].expand(-1, int(n)).clone()

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
              batch_conv: bool = False, shared: Optional[dict] = None) -> MimiTail:
    """Registry hook: a Mimi tail with checkpoint weights, or seeded random ones at ``size``.

    ``batch_conv``: one cuDNN call per second for the non-transposed convs (bit-identical to moshi on
    the H200 in docs/benchmarks.md, 9.4 vs 12.1 ms per audio second; other GPUs: check first).
    ``shared``: another tail's ``shared_weights()`` (same size/device/checkpoint/seed): nothing is loaded.
    """
    model = shared["model"] if shared is not None else build_model(size, device, seed, checkpoint, batch_conv=batch_conv)
    return MimiTail(model, device, num_codebooks, size=size, synthetic_weights=checkpoint is None,
                    demand_sized=demand_sized, graph_replay=graph_replay)
