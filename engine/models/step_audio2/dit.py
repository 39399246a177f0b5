"""The DiT estimator of the Step-Audio2 flow (conditional flow matching), streaming.

Input ``x|mu|spk|cond`` (320 channels) -> in_proj 512 -> ``depth`` DiT blocks (adaLN-zero modulation from
the time embedding; attention with per-head LayerNorm on q and k; a causal conv block; a GELU-tanh MLP)
-> adaLN final layer -> 80 channels. The chunk's queries attend over ``[new, cached]`` keys (newest
first, as the stock concatenates them), with no mask and no positions.

What only depends on the Euler step (the short clock: 10 steps, the same every chunk) is computed once
per device in :meth:`DiT.build_constants`: each step's time embedding, every block's adaLN modulation
(shift/scale/gate, ``1 + scale`` included) and the final layer's. Computed by the same ops on the same
device as the stock computes them per call, they are the same bits; the per-chunk graph then has no
time-embedding MLPs, no adaLN GEMMs and no per-call CPU frequency table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from .config import DiTConfig


class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding of ``1000 t`` (256 frequencies) -> MLP."""

    def __init__(self, hidden: int, freq_dim: int = 256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.freq_dim = freq_dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        # built on the CPU and moved, exactly as the stock builds it (only ever called at setup)
        freqs = torch.exp(-math.log(10000) * torch.arange(start=0, end=half) / half).to(t)
        args = (t * 1000)[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class SelfAttention(nn.Module):
    """q/k/v projections with per-head LayerNorm on q and k; keys/values live in the session cache."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.h, self.d = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.q_norm = nn.LayerNorm(head_dim)
        self.k_norm = nn.LayerNorm(head_dim)
        self.proj = nn.Linear(inner, dim)

    #: LayerNorm q/k over rows laid out (b, t, h, d) (each row normalised as in the stock's (b, h, t, d)
    #: copy, without the copy); False: the stock's layout
    rows_ln = True
    #: attend over strided views of the cache; False: contiguous copies, as the stock's torch.cat gives
    strided_kv = True

    def forward(self, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """x ``(b, t, C)``; ``kv`` ``(b, h, t + T0, 2d)`` whose first ``t`` frames this call writes."""
        b, t, _ = x.shape
        if self.rows_ln:
            q = self.q_norm(self.to_q(x).view(b, t, self.h, self.d)).transpose(1, 2)   # (b, h, t, d)
            k = self.k_norm(self.to_k(x).view(b, t, self.h, self.d)).transpose(1, 2)
        else:
            q = self.q_norm(self.to_q(x).reshape(b, t, self.h, self.d).transpose(1, 2))
            k = self.k_norm(self.to_k(x).reshape(b, t, self.h, self.d).transpose(1, 2))
        v = self.to_v(x).view(b, t, self.h, self.d).transpose(1, 2)
        kv[:, :, :t, :self.d].copy_(k)
        kv[:, :, :t, self.d:].copy_(v)
        keys, values = kv[..., :self.d], kv[..., self.d:]
        if not self.strided_kv:
            keys, values = keys.contiguous(), values.contiguous()
        out = F.scaled_dot_product_attention(q, keys, values)                      # (b, h, t, d)
        return self.proj(out.transpose(1, 2).reshape(b, t, -1))


class CausalConvBlock(nn.Module):
    """conv(k=3) -> LayerNorm -> Mish -> conv(k=3), both convs causal with a 2-frame cache each.

    Indices 1, 3, 6 match the stock's ``nn.Sequential`` (its transposes sit at the other indices).
    """

    def __init__(self, channels: int, kernel: int = 3):
        super().__init__()
        self.c, self.pad = channels, kernel - 1
        self.block = nn.Sequential(nn.Identity(), nn.Conv1d(channels, channels, kernel), nn.Identity(),
                                   nn.LayerNorm(channels), nn.Mish(), nn.Identity(),
                                   nn.Conv1d(channels, channels, kernel), nn.Identity())

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """x ``(b, t, C)``; ``cache`` ``(b, 2C, 2)``: read, then overwritten with this chunk's tails."""
        h = torch.cat([cache[:, :self.c], x.transpose(1, 2)], dim=2)          # (b, C, t+2)
        cache[:, :self.c].copy_(h[..., -self.pad:])
        h = self.block[1](h).transpose(1, 2)                                  # (b, t, C)
        h = self.block[4](self.block[3](h)).transpose(1, 2)                   # (b, C, t)
        h = torch.cat([cache[:, self.c:], h], dim=2)
        cache[:, self.c:].copy_(h[..., -self.pad:])
        return self.block[6](h).transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@dataclass
class Modulation:
    """One block's adaLN output at one Euler step: shifts, ``1 + scale`` factors and gates, (b, 1, C) each."""

    shift: List[torch.Tensor]      # msa, mlp, conv
    scale1: List[torch.Tensor]     # 1 + scale (msa, mlp, conv)
    gate: List[torch.Tensor]


class DiTBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(hidden, heads, head_dim)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(hidden, int(hidden * mlp_ratio))
        self.norm3 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.conv = CausalConvBlock(hidden)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 9 * hidden))

    def modulation(self, c: torch.Tensor) -> Modulation:
        """As the stock's ``adaLN_modulation(c).chunk(9)`` (order: msa, mlp, conv for shift/scale/gate)."""
        sm, cm, gm, sp, cp, gp, sc, cc, gc = self.adaLN_modulation(c).chunk(9, dim=-1)
        return Modulation([sm, sp, sc], [1 + cm, 1 + cp, 1 + cc], [gm, gp, gc])

    def forward(self, x: torch.Tensor, m: Modulation, kv: torch.Tensor, cnn: torch.Tensor) -> torch.Tensor:
        # modulate(x, shift, scale) = x * (1 + scale) + shift, with (1 + scale) precomputed
        x = x + m.gate[0] * self.attn(self.norm1(x) * m.scale1[0] + m.shift[0], kv)
        x = x + m.gate[2] * self.conv(self.norm3(x) * m.scale1[2] + m.shift[2], cnn)
        return x + m.gate[1] * self.mlp(self.norm2(x) * m.scale1[1] + m.shift[1])


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int):
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, out_channels)

    def modulation(self, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return shift, 1 + scale

    def forward(self, x, shift, scale1):
        return self.linear(self.norm_final(x) * scale1 + shift)


class DiT(nn.Module):
    """The estimator. :meth:`build_constants` must run (on the final device) before :meth:`forward`."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.t_embedder = TimestepEmbedder(cfg.hidden)
        self.in_proj = nn.Linear(cfg.in_channels, cfg.hidden)
        self.blocks = nn.ModuleList(DiTBlock(cfg.hidden, cfg.heads, cfg.head_dim, cfg.mlp_ratio)
                                    for _ in range(cfg.depth))
        self.final_layer = FinalLayer(cfg.hidden, cfg.out_channels)
        self.mods: List[List[Modulation]] = []
        self.final_mods: list = []

    def _modulation_layers(self) -> List[nn.Module]:
        return [self.t_embedder, self.final_layer.adaLN_modulation] + [b.adaLN_modulation for b in self.blocks]

    @torch.no_grad()
    def build_constants(self, t_steps: List[torch.Tensor]) -> None:
        """Per Euler step: the block modulations from ``t_embedder(t.repeat(2))``, as the stock's per-call path.

        The time-embedding MLP and the adaLN layers (151 MB at the released size) are only needed here:
        afterwards they are parked on the CPU, so the device holds the 8 MB of constants instead.
        """
        dev = self.in_proj.weight.device
        for m in self._modulation_layers():
            m.to(dev)
        self.mods, self.final_mods = [], []
        for t in t_steps:
            c = self.t_embedder(t.repeat(2)).unsqueeze(1)                     # (2, 1, C)
            self.mods.append([blk.modulation(c) for blk in self.blocks])
            self.final_mods.append(self.final_layer.modulation(c))
        for m in self._modulation_layers():
            m.to("cpu")

    def forward(self, xin: torch.Tensor, step: int, kv: torch.Tensor, cnn: torch.Tensor) -> torch.Tensor:
        """xin ``(2, 320, t)``; ``kv`` ``(depth, 2, h, t + T0, 2d)``; ``cnn`` ``(depth, 2, 2C, 2)``.

        Returns the velocity ``(2, 80, t)`` (a transposed view, as the stock returns it).
        """
        x = self.in_proj(xin.transpose(1, 2))                                 # (2, t, C)
        mods = self.mods[step]
        for i, blk in enumerate(self.blocks):
            x = blk(x, mods[i], kv[i], cnn[i])
        shift, scale1 = self.final_mods[step]
        return self.final_layer(x, shift, scale1).transpose(1, 2)
