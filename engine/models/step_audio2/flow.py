"""The Step-Audio2 flow: token embedding -> conformer encoder -> 10-step Euler CFM with a DiT (CFG as batch 2).

One chunk (:meth:`Flow.chunk`) turns 25 new tokens + 3 lookahead into 50 mel frames; the prompt prefill
(:meth:`Flow.prefill`) runs the same code over the voice prompt with the prompt mel as condition, which
fills every cache. Caches are the session's state regions, passed in as views and written in place.

The cosine time schedule and every Euler step's ``dt`` are the same every chunk: :meth:`Flow.build_constants`
computes them once on the device, by the stock's own sequence of device ops (so the same bits), and
hands each step's ``t`` to the DiT for its modulation constants.
"""
from __future__ import annotations

from typing import List, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .config import FlowConfig
from .dit import DiT
from .encoder import UpsampleConformerEncoder


class CFM(nn.Module):
    """Holds the estimator (the stock nests it as ``decoder.estimator``)."""

    def __init__(self, cfg: FlowConfig):
        super().__init__()
        self.estimator = DiT(cfg.dit)


class Flow(nn.Module):
    """Token -> mel flow. Parameter names follow the released flow.pt."""

    def __init__(self, cfg: FlowConfig):
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = UpsampleConformerEncoder(cfg.encoder)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = CFM(cfg)
        self.dts: List[torch.Tensor] = []
        self.ready_on: Optional[torch.device] = None

    @property
    def up_rate(self) -> int:
        return self.cfg.encoder.up_stride

    @torch.no_grad()
    def build_constants(self) -> None:
        """The Euler schedule (t per step, dt per step) and the DiT's per-step modulation, on this device."""
        p = self.spk_embed_affine_layer.weight
        n = self.cfg.n_timesteps
        t_span = torch.linspace(0, 1, n + 1, device=p.device, dtype=p.dtype)
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        t, dt = t_span[0], t_span[1] - t_span[0]
        t = t.unsqueeze(dim=0)
        ts, dts = [], []
        for step in range(1, n + 1):
            ts.append(t)
            dts.append(dt)
            t = t + dt
            if step < n:
                dt = t_span[step + 1] - t
        self.dts = dts
        self.encoder.build_constants()
        self.decoder.estimator.build_constants(ts)
        self.ready_on = p.device

    def speaker(self, spk: torch.Tensor) -> torch.Tensor:
        """x-vector ``(1, 192)`` -> CFG pair ``(2, 80)``: the projected speaker and zeros."""
        s = self.spk_embed_affine_layer(F.normalize(spk, dim=1))
        return torch.cat([s, torch.zeros_like(s)], dim=0)

    def _check_ready(self):
        dev = self.spk_embed_affine_layer.weight.device
        if self.ready_on != dev:
            raise RuntimeError("Flow.build_constants() must run on the model's device before streaming")

    def encode(self, tokens: torch.Tensor, last: bool, enc: Mapping, before: int, first_use: bool):
        """Tokens ``(1, n)`` -> mu ``(1, 80, frames)`` (contiguous, as the estimator is fed); ``enc``: the
        encoder's handles (its regions under their short names), ``first_use``: the prompt prefill."""
        xs = self.input_embedding(tokens)
        h = self.encoder.prefill(xs, enc) if first_use else self.encoder.stream(xs, last, enc, before)
        return self.encoder_proj(h).transpose(1, 2).contiguous()

    def solve(self, mu: torch.Tensor, spk2: torch.Tensor, cond: Optional[torch.Tensor], noise: torch.Tensor,
              est_att: torch.Tensor, est_cnn: torch.Tensor) -> torch.Tensor:
        """The Euler loop over the chunk's ``t`` frames. ``noise`` ``(1, 80, t)``; caches ``(steps, depth, ...)``."""
        self._check_ready()
        dit = self.decoder.estimator
        b, c, t = 2, mu.shape[1], mu.shape[2]
        # x | mu | spk | cond, built once per chunk; each Euler step rewrites only its x rows
        xin = mu.new_empty(b, 4 * c, t)
        xin[:1, c:2 * c].copy_(mu)
        xin[1:, c:2 * c].zero_()
        xin[:, 2 * c:3 * c].copy_(spk2.unsqueeze(-1).expand(b, c, t))
        if cond is None:
            xin[:, 3 * c:].zero_()
        else:
            xin[:1, 3 * c:].copy_(cond)
            xin[1:, 3 * c:].zero_()
        x = noise                                    # the stock multiplies by temperature 1.0: exact
        rate = self.cfg.cfg_rate
        for step in range(self.cfg.n_timesteps):
            xin[:, :c].copy_(x.expand(b, c, t))
            v = dit(xin, step, est_att[step], est_cnn[step])
            v_cond, v_uncond = v.chunk(2, dim=0)
            v = (1.0 + rate) * v_cond - rate * v_uncond
            x = x + self.dts[step] * v
        return x
