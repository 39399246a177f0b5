"""The token encoder of the Step-Audio2 flow: ``UpsampleConformerEncoderV2``, streaming.

25 Hz token embeddings -> linear embed -> pre-lookahead conv (3 tokens) -> ``num_blocks`` conformer
layers at 25 Hz -> nearest x2 upsample + conv -> linear embed -> ``num_up_blocks`` layers at 50 Hz ->
LayerNorm. Attention is espnet relative-position self-attention with a key bias; there is no mask.

Streaming state, as the stock runtime keeps it (and so as our ``enc_att`` region holds it):
* the attention cache ``(blocks, 1, heads, T, 2*d_k)`` counts 50 Hz frames: the up layers append 50 per
  chunk; the 25 Hz layers keep their keys/values *twice over* (``[a, a]``, length ``T``) and read the first
  ``T/2``. The session truncates the whole region to prompt + last 100 frames (PrefixWindow), which is
  why the 25 Hz layers end up re-reading a frozen prefix: the stock behaviour, kept bit for bit.
* the conv cache ``(1, C, 2 + 2*stride)``: the lookahead conv's last 2 outputs, the upsample's last 4.

Every op mirrors the stock arithmetic and memory layout (bit-identity); caches are written in place.
As a streaming block the encoder declares both caches itself (:meth:`UpsampleConformerEncoder.regions`,
short names ``att`` / ``cnn``; the holder picks the clock and the attention retention and mounts them
under a prefix) and runs over those handles (:meth:`~UpsampleConformerEncoder.stream`, ``prefill``).
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from engine.core import STILL, Clock, Region, Retention, Static
from engine.fastpath import Verdict

from .checked import CheckedPaths, streams_only
from .config import EncoderConfig
from .lanes import parallel


def rel_position_table(d_model: int, max_len: int = 5000) -> torch.Tensor:
    """Sinusoids of relative positions ``[1, 2*max_len - 1, d]``, rows from ``r = max_len - 1`` down to ``-(max_len - 1)``.

    Columns ``2i, 2i+1`` of row ``r`` hold ``sin(r w_i), cos(r w_i)`` with ``w_i = 10000^(-2i/d)``. Sine is odd and
    cosine even, so the angles are taken for ``|r|`` only and the rows with ``r < 0`` negate the sine (exact).
    """
    freq = torch.exp(-(math.log(10000.0) / d_model) * torch.arange(0, d_model, 2, dtype=torch.float32))  # [d/2]
    angle = torch.arange(max_len, dtype=torch.float32).unsqueeze(1) * freq          # [max_len, d/2], |r| w_i
    sin, cos = torch.sin(angle), torch.cos(angle)
    r = torch.arange(max_len - 1, -max_len, -1)                                      # [2*max_len - 1]
    sign = torch.where(r < 0, -1.0, 1.0).unsqueeze(1)                                # [2*max_len - 1, 1]
    rows = torch.stack([sin[r.abs()] * sign, cos[r.abs()]], dim=-1)                 # [2*max_len - 1, d/2, 2]
    return rows.reshape(1, 2 * max_len - 1, d_model)


class LinearEmbed(nn.Module):
    """Linear -> LayerNorm -> scale by sqrt(d) (dropout is identity at inference)."""

    def __init__(self, idim: int, odim: int):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5), nn.Identity())
        self.xscale = math.sqrt(odim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * self.xscale


class RelPosSelfAttention(nn.Module):
    """Self-attention with relative positions (Transformer-XL): the logit of query ``i`` and key ``j`` is
    ``(q_i + u) . k_j + (q_i + v) . p(i - j)``, divided by ``sqrt(d_k)``; ``u``, ``v`` learned per head and ``p``
    a linear map of the sinusoidal table (see :func:`rel_position_table`)."""

    def __init__(self, heads: int, dim: int):
        super().__init__()
        self.h, self.d_k = heads, dim // heads
        self.linear_q = nn.Linear(dim, dim)
        self.linear_k = nn.Linear(dim, dim)
        self.linear_v = nn.Linear(dim, dim)
        self.linear_out = nn.Linear(dim, dim)
        self.linear_pos = nn.Linear(dim, dim, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.d_k))
        #: ``linear_pos`` of the position table per table length: clock-only work (the lengths a stream meets are
        #: set by its plan), computed once, eagerly, by the same op (so the same bits) and read afterwards
        self.rel_cache: Dict[int, torch.Tensor] = {}

    @staticmethod
    def skew(by_offset: torch.Tensor, keys: int) -> torch.Tensor:
        """Logits against relative offsets -> logits against keys, as a strided view (no copy).

        ``by_offset`` ``[b, h, t, 2*keys - 1]``: column ``m`` is the offset ``keys - 1 - m``. The ``t`` queries are
        the last ``t`` of ``keys`` frames, so query ``i`` meets key ``j`` at offset ``keys - t + i - j``, which is
        column ``t - 1 - i + j``: each row starts one column earlier than the row above. Returns ``[b, h, t, keys]``.
        """
        b, h, t, _ = by_offset.shape
        sb, sh, row, col = by_offset.stride()
        return by_offset.as_strided((b, h, t, keys), (sb, sh, row - col, col),
                                    by_offset.storage_offset() + (t - 1) * col)

    def _heads(self, y: torch.Tensor) -> torch.Tensor:
        """``[1, t, h * d_k]`` -> ``[1, t, h, d_k]`` (a view)."""
        return y.view(y.shape[0], y.shape[1], self.h, self.d_k)

    def _rel(self, pos_emb: torch.Tensor) -> torch.Tensor:
        """``linear_pos(pos_emb)`` ``[1, 2T-1, C]``, from :attr:`rel_cache` once computed outside a capture."""
        n = pos_emb.shape[1]
        rel = self.rel_cache.get(n)
        if rel is None:
            rel = self.linear_pos(pos_emb)
            if not (rel.is_cuda and torch.cuda.is_current_stream_capturing()):
                self.rel_cache[n] = rel
        return rel

    def _project(self, x: torch.Tensor, slot: torch.Tensor, which: int) -> torch.Tensor:
        """Keys (0) or values (1) ``[1, h, t, d_k]`` of the chunk, also written to their half of ``slot``."""
        y = self._heads((self.linear_k if which == 0 else self.linear_v)(x)).transpose(1, 2)
        slot[..., which * self.d_k:(which + 1) * self.d_k].copy_(y)
        return y

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, cache: Optional[torch.Tensor],
                slot: torch.Tensor, lanes: bool = False) -> torch.Tensor:
        """x ``[1, t, C]``; cache ``[1, h, T0, 2*d_k]`` or None; ``slot`` ``[1, h, t, 2*d_k]`` receives the new k|v;
        ``pos_emb`` ``[1, 2*(T0 + t) - 1, C]``. Returns ``[1, t, C]``. ``lanes``: the q, k and v projections side
        by side (:func:`.lanes.parallel`, the same kernels)."""
        dk, t = self.d_k, x.shape[1]
        q, keys, values = parallel([lambda: self._heads(self.linear_q(x)),                  # [1, t, h, d_k]
                                    lambda: self._project(x, slot, 0), lambda: self._project(x, slot, 1)],
                                   x.device, lanes)                                        # [1, h, t, d_k] each
        if cache is not None:                                                   # [1, h, T0 + t, d_k]
            keys = torch.cat([cache[..., :dk], keys], dim=2)
            values = torch.cat([cache[..., dk:], values], dim=2)
        rel = self._heads(self._rel(pos_emb)).transpose(1, 2)                   # [1, h, 2T-1, d_k]
        content = torch.matmul((q + self.pos_bias_u).transpose(1, 2), keys.transpose(2, 3))     # [1, h, t, T]
        by_offset = torch.matmul((q + self.pos_bias_v).transpose(1, 2), rel.transpose(2, 3))   # [1, h, t, 2T-1]
        logits = (content + self.skew(by_offset, keys.shape[2])) / math.sqrt(dk)
        mixed = torch.matmul(torch.softmax(logits, dim=-1), values)             # [1, h, t, d_k]
        return self.linear_out(mixed.transpose(1, 2).reshape(x.shape[0], t, self.h * dk))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.activation = nn.SiLU()
        self.w_2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class ConformerLayer(nn.Module):
    """Pre-norm attention + feed-forward (no macaron, no conv module in this encoder)."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.self_attn = RelPosSelfAttention(heads, dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.norm_ff = nn.LayerNorm(dim, eps=1e-12)
        self.norm_mha = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x, pos_emb, cache, slot, lanes: bool = False):
        x = x + self.self_attn(self.norm_mha(x), pos_emb, cache, slot, lanes)
        # the stock multiplies the feed-forward by ff_scale = 1.0: exact, so not repeated here
        return x + self.feed_forward(self.norm_ff(x))


class PreLookahead(nn.Module):
    """conv(k = lookahead + 1) over the chunk's own lookahead, leaky ReLU, causal conv(k=3) with a 2-frame cache."""

    def __init__(self, channels: int, lookahead: int):
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, channels, lookahead + 1)
        self.conv2 = nn.Conv1d(channels, channels, 3)

    def forward(self, xs: torch.Tensor, cache: Optional[torch.Tensor], new_cache: torch.Tensor) -> torch.Tensor:
        """xs ``(1, n, C)`` -> ``(1, n - lookahead, C)``; writes its last 2 conv1 outputs to ``new_cache``."""
        out = F.leaky_relu(self.conv1(xs.transpose(1, 2).contiguous()))    # (1, C, n - L)
        if cache is None:
            cache = out.new_zeros(out.shape[0], out.shape[1], 2)
        out = torch.cat([cache, out], dim=2)
        new_cache.copy_(out[..., -2:])
        out = self.conv2(out).transpose(1, 2).contiguous()
        return out + xs[:, :-self.lookahead]


class Upsample(nn.Module):
    """Nearest x stride, then conv(k = 2*stride + 1) with a 2*stride-frame cache."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, stride * 2 + 1)

    def forward(self, xs: torch.Tensor, cache: Optional[torch.Tensor], new_cache: torch.Tensor) -> torch.Tensor:
        out = F.interpolate(xs, scale_factor=float(self.stride), mode="nearest")   # (1, C, s*t)
        if cache is None:
            cache = xs.new_zeros(xs.shape[0], xs.shape[1], self.stride * 2)
        out = torch.cat([cache, out], dim=2)
        new_cache.copy_(out[..., -self.stride * 2:])
        return self.conv(out)


class UpsampleConformerEncoder(nn.Module):
    """The streaming encoder; :meth:`chunk` runs one chunk over the caches in place."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        c = cfg.output_size
        self.cfg = cfg
        self.embed = LinearEmbed(cfg.input_size, c)
        self.pre_lookahead_layer = PreLookahead(c, cfg.pre_lookahead)
        self.encoders = nn.ModuleList(ConformerLayer(c, cfg.heads, cfg.linear_units) for _ in range(cfg.num_blocks))
        self.up_layer = Upsample(c, cfg.up_stride)
        self.up_embed = LinearEmbed(cfg.input_size, c)
        self.up_encoders = nn.ModuleList(ConformerLayer(c, cfg.heads, cfg.linear_units)
                                         for _ in range(cfg.num_up_blocks))
        self.after_norm = nn.LayerNorm(c, eps=1e-5)
        self.register_buffer("pe", rel_position_table(c), persistent=False)
        #: per chunk length: the self-check's verdicts on the faster paths (:meth:`fast`)
        self.checked = CheckedPaths("step-audio2 encoder", ("parallel lanes",), self._trial, self._trial_inputs,
                                    streams_only)

    def build_constants(self) -> None:
        """Forget what was computed for other weights or another device (position projections, verdicts)."""
        for layer in self.layers():
            layer.self_attn.rel_cache = {}
        self.checked.clear()

    def layers(self) -> List[ConformerLayer]:
        return list(self.encoders) + list(self.up_encoders)

    # -- faster paths, checked per GPU -------------------------------------------------------------------
    def fast(self, t: int) -> Dict[str, bool]:
        """Which faster paths run for layers over ``t`` frames (checked once per length, see ``checked``)."""
        return self.checked.which(t, self.pe.device, self.cfg)

    @torch.no_grad()
    def _trial_inputs(self, t: int, path: str) -> List[torch.Tensor]:
        """A seeded random chunk and cache (``t`` frames each) and the slot the layer writes, for :meth:`_trial`."""
        c, h = self.cfg.output_size, self.cfg.heads
        g = torch.Generator().manual_seed(3000 + t)
        x = torch.randn(1, t, c, generator=g).to(self.pe.device)
        cache = torch.randn(1, h, t, 2 * c // h, generator=g).to(self.pe.device)
        slot = torch.zeros(1, h, t, 2 * c // h, device=self.pe.device)
        return [x, cache, slot]

    @torch.no_grad()
    def _trial(self, t: int, path: str, on: bool, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        """The first layer over :meth:`_trial_inputs`, ``path`` off or on."""
        x, cache, slot = inputs
        out = self.layers()[0](x, self.pos_emb(2 * t), cache, slot, lanes=on and path == "parallel lanes")
        return [out, slot]

    def verdicts(self) -> List[Verdict]:
        return self.checked.verdicts()

    # -- streaming block -------------------------------------------------------------------------------
    def regions(self, clock: Clock, keep: Retention) -> List[Region]:
        """Both caches under this block's short names: ``att`` counts 50 Hz frames on ``clock`` and keeps
        what ``keep`` says (Step-Audio2: prompt + last 100); ``cnn`` is replaced in place every chunk."""
        e = self.cfg
        blocks = e.num_blocks + e.num_up_blocks
        return [Region("att", (blocks, 1, e.heads, None, 2 * (e.output_size // e.heads)), clock, keep,
                       stock_note="torch.cat grow and truncate", doc="keys | values of every layer [L, 1, h, T, 2d_k]"),
                Region("cnn", (1, e.output_size, 2 + 2 * e.up_stride), STILL, Static(),
                       stock_note="new tensors each call", doc="lookahead conv's last 2 | upsample's last 2s")]

    def stream(self, xs: torch.Tensor, last: bool, state: Mapping, before: int) -> torch.Tensor:
        """One streamed chunk over this block's handles (``att`` grown by the chunk's frames);
        ``before``: the 50 Hz frames ``att`` held before it. See :meth:`chunk`."""
        return self.chunk(xs, last, state["cnn"].get(), state["att"].grow(), before, False)

    def prefill(self, xs: torch.Tensor, state: Mapping) -> torch.Tensor:
        """The prompt, run with no cache into the handles (``att`` holds the prompt's frames)."""
        return self.chunk(xs, False, state["cnn"].get(), state["att"].get(), 0, True)

    def pos_emb(self, size: int) -> torch.Tensor:
        mid = self.pe.size(1) // 2
        return self.pe[:, mid - size + 1: mid + size]

    def chunk(self, xs: torch.Tensor, last: bool, cnn: torch.Tensor, att: torch.Tensor, before: int,
              first_use: bool) -> torch.Tensor:
        """One chunk. ``xs`` ``(1, n, C)`` token embeddings (lookahead included).

        ``cnn`` ``(1, C, 2 + 2s)`` conv cache (read, then overwritten); ``att`` the working view
        ``(blocks, 1, h, before + adv, 2*d_k)`` whose first ``before`` frames are the cache and whose tail
        this chunk fills. ``first_use``: no cache yet (prompt prefill): caches read as absent/zero.
        Returns ``(1, 2*(n - lookahead), C)`` (``2n`` on the last chunk, whose lookahead is zero padding).
        """
        nb, s = len(self.encoders), self.cfg.up_stride
        off1 = before // 2
        xs = self.embed(xs)
        if last:
            xs = F.pad(xs, (0, 0, 0, self.cfg.pre_lookahead))
        xs = self.pre_lookahead_layer(xs, None if first_use else cnn[:, :, :2], cnn[:, :, :2])
        t1 = xs.shape[1]
        pos = self.pos_emb(off1 + t1)
        lanes = bool(self.encoders) and self.fast(t1)["parallel lanes"]
        for i, layer in enumerate(self.encoders):
            cache = None if first_use else att[i, :, :, :off1]
            xs = layer(xs, pos, cache, att[i, :, :, off1:off1 + t1], lanes)
        if nb:
            # the 25 Hz keys/values are stored twice over ([a, a]), as the stock's repeat(1, 1, 1, 2, 1)
            n1 = off1 + t1
            att[:nb, :, :, n1:2 * n1].copy_(att[:nb, :, :, :n1])
        xs = self.up_layer(xs.transpose(1, 2).contiguous(), None if first_use else cnn[:, :, 2:], cnn[:, :, 2:])
        xs = self.up_embed(xs.transpose(1, 2).contiguous())
        t2 = xs.shape[1]
        pos = self.pos_emb(off1 * s + t2)
        lanes = bool(self.up_encoders) and self.fast(t2)["parallel lanes"]
        for i, layer in enumerate(self.up_encoders):
            cache = None if first_use else att[nb + i, :, :, :before]
            xs = layer(xs, pos, cache, att[nb + i, :, :, before:before + t2], lanes)
        return self.after_norm(xs)
