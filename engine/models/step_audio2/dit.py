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
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from engine.fastpath import Verdict

from . import fused as fused_kernels
from . import linears
from .checked import CheckedPaths, streams_only
from .config import DiTConfig
from .fused import available as fused_available
from .fused import after_cache, mul_add
from .fused import worth_it as fused_worth_it
from .lanes import fork, parallel

#: the DiT's optional faster paths, each enabled per chunk length by a start-up self-check (:meth:`DiT.fast`)
FAST_PATHS = ("frames-major convs", "parallel lanes", "fused elementwise", "split-K linears")
#: the paths that are Triton kernels (the split-K linears run with the fused elementwise kernels: their gated
#: residuals finish the attention's and the MLP's output projections)
TRITON_PATHS = ("fused elementwise", "split-K linears")


def _not_applicable(path: str, device: torch.device) -> Optional[str]:
    return fused_available(device) if path in TRITON_PATHS else streams_only(path, device)


def captured_only(path: str) -> bool:
    """Whether ``path`` runs only while a CUDA graph is captured (the Triton kernels, unless ``fused.EAGER``:
    :func:`.fused.worth_it`): then it is checked, and reported, as such."""
    return path in TRITON_PATHS and not fused_kernels.EAGER


def _linear(layer: nn.Linear, x: torch.Tensor, own: bool) -> torch.Tensor:
    """``layer(x)``; ``own``: summed by :func:`.linears.linear` (cuBLAS's split-K order, one kernel pair) from
    the layer's transposed weight (:meth:`DiTBlock.build_transposed`)."""
    return linears.linear(x, layer.weight_t, layer.bias) if own else layer(x)


def _weight_key(w: torch.Tensor) -> tuple:
    """What a transposed copy of ``w`` is valid for: its storage and (outside inference mode, where tensors
    count their in-place writes) its version."""
    return w.device, w.data_ptr(), -1 if w.is_inference() else w._version


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

    def forward(self, x: torch.Tensor, kv: torch.Tensor, lanes: bool = False) -> torch.Tensor:
        """x ``(b, t, C)``; ``kv`` ``(b, h, t + T0, 2d)`` whose first ``t`` frames this call writes.

        ``lanes``: the q, k and v projections (each with its LayerNorm / cache write) run side by side
        (:func:`.lanes.parallel`; the same kernels on the same inputs)."""
        return self.proj(self.attend(x, kv, lanes))

    def attend(self, x: torch.Tensor, kv: torch.Tensor, lanes: bool = False, own: bool = False) -> torch.Tensor:
        """:meth:`forward` without the output projection: the heads' outputs ``(b, t, h d)``. ``own``: the q, k
        and v projections by :func:`.linears.linear`.

        On the CPU the attention's library calls are the stock's own (:meth:`_attend_as_the_stock`). Elsewhere q
        and k are normalised as rows laid out ``(b, t, h, d)`` and the attention reads strided views of the cache
        (no copies; on CUDA the bits are the stock's, as the GPU tests show)."""
        if x.device.type == "cpu" and not own:
            return self._attend_as_the_stock(x, kv)
        b, t, _ = x.shape
        q, _, _ = parallel([lambda: self._q(x, own), lambda: self._kv_write(x, kv, 0, own),
                            lambda: self._kv_write(x, kv, 1, own)], x.device, on=lanes)
        out = F.scaled_dot_product_attention(q, kv[..., :self.d], kv[..., self.d:])   # (b, h, t, d)
        return out.transpose(1, 2).reshape(b, t, -1)

    def _attend_as_the_stock(self, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """The stock's layouts: q and k normalised as ``(b, h, t, d)`` views of the projections, and the attention
        over contiguous keys and values, as its ``torch.cat`` of the chunk's and the cache's makes them; over the
        prompt, with no cache before it, over the chunk's own k (normalised) and v (a view), as the stock."""
        b, t, _ = x.shape
        q = self.q_norm(self.to_q(x).reshape(b, t, self.h, self.d).transpose(1, 2))
        k = self.k_norm(self.to_k(x).reshape(b, t, self.h, self.d).transpose(1, 2))
        v = self.to_v(x).reshape(b, t, self.h, self.d).transpose(1, 2)
        kv[:, :, :t, :self.d].copy_(k)
        kv[:, :, :t, self.d:].copy_(v)
        if kv.shape[2] > t:
            k, v = kv[..., :self.d].contiguous(), kv[..., self.d:].contiguous()
        out = F.scaled_dot_product_attention(q, k, v)                               # (b, h, t, d)
        return out.transpose(1, 2).reshape(b, t, -1)

    def _q(self, x: torch.Tensor, own: bool = False) -> torch.Tensor:
        b, t, _ = x.shape
        return self.q_norm(_linear(self.to_q, x, own).view(b, t, self.h, self.d)).transpose(1, 2)   # (b, h, t, d)

    def _kv_write(self, x: torch.Tensor, kv: torch.Tensor, which: int, own: bool = False) -> None:
        """Keys (0: with their LayerNorm) or values (1) of the chunk, into the first ``t`` cache frames."""
        b, t, _ = x.shape
        if which == 0:
            y = self.k_norm(_linear(self.to_k, x, own).view(b, t, self.h, self.d))      # (b, t, h, d)
        else:
            y = _linear(self.to_v, x, own).view(b, t, self.h, self.d)
        kv[:, :, :t, which * self.d:(which + 1) * self.d].copy_(y.transpose(1, 2))


class CausalConvBlock(nn.Module):
    """conv(k=3) -> LayerNorm -> Mish -> conv(k=3), both convs causal with a 2-frame cache each.

    Indices 1, 3, 6 match the stock's ``nn.Sequential`` (its transposes sit at the other indices).

    Two layouts of the same arithmetic. :meth:`forward` is the stock's: channels-first ``[b, C, 2+t]``
    activations (``torch.cat`` of the cache and the chunk), whose input and filter cuDNN converts to
    channels-last before its kernel (two layout kernels a conv on the H200, every call). :meth:`forward_fused`
    keeps that layout with fewer other kernels. :meth:`forward_frames_major` keeps the frames
    major, ``[b, 2+t, C]``, so each conv reads a channels-last view and writes a channels-last output: no
    conversions, no cat (the modulated chunk and the Mish are written straight after the cached frames),
    and the LayerNorm reads the conv's output without a contiguous copy. Whether cuDNN then runs a kernel
    with the same bits is up to the GPU and library, so the DiT enables it per length only after a start-up
    self-check (:meth:`DiT.fast`; refused on the H200 with cuDNN 9 / torch 2.11: another kernel, 7e-5 off).
    """

    def __init__(self, channels: int, kernel: int = 3):
        super().__init__()
        self.c, self.pad = channels, kernel - 1
        self.block = nn.Sequential(nn.Identity(), nn.Conv1d(channels, channels, kernel), nn.Identity(),
                                   nn.LayerNorm(channels), nn.Mish(), nn.Identity(),
                                   nn.Conv1d(channels, channels, kernel), nn.Identity())
        self.weights_cl: List[torch.Tensor] = []          # channels-last copies, made by build_layouts

    @torch.no_grad()
    def build_layouts(self) -> None:
        """Channels-last copies of both conv weights (``[C_out, C_in, k]`` viewed over ``[C_out, k, C_in]``
        memory), so cuDNN gets weight and input in one layout and converts neither."""
        self.weights_cl = [conv.weight.permute(0, 2, 1).contiguous().permute(0, 2, 1)
                           for conv in (self.block[1], self.block[6])]

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """x ``(b, t, C)``; ``cache`` ``(b, 2C, 2)``: read, then overwritten with this chunk's tails."""
        h = torch.cat([cache[:, :self.c], x.transpose(1, 2)], dim=2)          # (b, C, t+2)
        cache[:, :self.c].copy_(h[..., -self.pad:])
        h = self.block[1](h).transpose(1, 2)                                  # (b, t, C)
        h = self.block[4](self.block[3](h)).transpose(1, 2)                   # (b, C, t)
        h = torch.cat([cache[:, self.c:], h], dim=2)
        cache[:, self.c:].copy_(h[..., -self.pad:])
        return self.block[6](h).transpose(1, 2)

    @torch.no_grad()                     # inference only: the in-place writes below have no autograd form
    def forward_fused(self, normed: torch.Tensor, scale1: torch.Tensor, shift: torch.Tensor, cache: torch.Tensor,
                      lanes: bool = False) -> torch.Tensor:
        """The stock layout with fewer kernels: the cached frames and the modulation ``normed * scale1 + shift``
        after them are written by one kernel (:func:`.fused.after_cache`, no cat), the first conv's bias is added
        by the copy that lays its output out for the LayerNorm, and the second conv's bias is left to the
        caller's fused gated residual. ``lanes``: the cache write-backs run beside the convs.

        ``normed`` ``[b, t, C]``; ``scale1``, ``shift`` ``[b, 1, C]``; ``cache`` ``[b, 2C, 2]`` as in
        :meth:`forward`. Returns the second conv's output *without its bias*, ``[b, C, t]``."""
        b, t, c = normed.shape
        p, dev = self.pad, normed.device
        h = after_cache(cache[:, :c], normed, scale1, shift)                   # [b, C, 2+t], the stock's cat
        back1 = fork(lambda: _write(cache[:, :c], h[..., -p:]), dev, 0, lanes)
        y = F.conv1d(h, self.block[1].weight)                                 # [b, C, t]
        z = torch.add(y.transpose(1, 2), self.block[1].bias, out=y.new_empty(b, t, c))   # [b, t, C] + bias
        z = self.block[4](self.block[3](z))
        h2 = torch.cat([cache[:, c:], z.transpose(1, 2)], dim=2)               # [b, C, 2+t]
        back1.join()
        back2 = fork(lambda: _write(cache[:, c:], h2[..., -p:]), dev, 1, lanes)
        y2 = F.conv1d(h2, self.block[6].weight)
        back2.join()
        return y2

    @torch.no_grad()                     # inference only: the in-place writes below have no autograd form
    def forward_frames_major(self, scaled: torch.Tensor, shift: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """The same block from the modulation's halves: ``scaled + shift`` is its input (``scaled``
        ``[b, t, C]``, ``shift`` ``[b, 1, C]``); ``cache`` ``[b, 2C, 2]`` as in :meth:`forward`. Returns ``[b, t, C]``."""
        b, t, c = scaled.shape
        p = self.pad
        w1, w2 = self.weights_cl
        h = scaled.new_empty(b, p + t, c)                                      # [b, 2+t, C]
        h[:, :p].copy_(cache[:, :c].transpose(1, 2))
        torch.add(scaled, shift, out=h[:, p:])                                # the modulation's add, in place
        cache[:, :c].copy_(h[:, -p:].transpose(1, 2))
        y = F.conv1d(h.transpose(1, 2), w1, self.block[1].bias)               # [b, C, t], channels-last
        y = self.block[3](y.transpose(1, 2))                                  # [b, t, C], no copy
        h2 = y.new_empty(b, p + t, c)
        h2[:, :p].copy_(cache[:, c:].transpose(1, 2))
        torch.ops.aten.mish.out(y, out=h2[:, p:])
        cache[:, c:].copy_(h2[:, -p:].transpose(1, 2))
        return F.conv1d(h2.transpose(1, 2), w2, self.block[6].bias).transpose(1, 2)   # [b, t, C]


def _write(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.hidden(x))

    def hidden(self, x):
        """The second layer's input."""
        return self.act(self.fc1(x))


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

    def own_layers(self) -> List[nn.Linear]:
        """The five 512-wide linears the split-K path computes (q, k, v, the attention's output, the MLP's second
        layer)."""
        return [self.attn.to_q, self.attn.to_k, self.attn.to_v, self.attn.proj, self.mlp.fc2]

    def has_transposed(self) -> bool:
        """Whether :meth:`build_transposed` made the split-K path's weights for the weights as they are now."""
        return all(getattr(layer, "weight_t_of", None) == _weight_key(layer.weight) for layer in self.own_layers())

    @torch.no_grad()
    def build_transposed(self) -> None:
        """Each :meth:`own_layers` weight's ``[K, N]`` copy (``weight_t``, a plain attribute: 8 MB a block at the
        released size), made once, before any capture, where the split-K path is chosen."""
        for layer in self.own_layers():
            layer.weight_t = linears.transposed(layer.weight)
            layer.weight_t_of = _weight_key(layer.weight)

    def drop_transposed(self) -> None:
        for layer in self.own_layers():
            layer.__dict__.pop("weight_t", None)
            layer.__dict__.pop("weight_t_of", None)

    def forward(self, x: torch.Tensor, m: Modulation, kv: torch.Tensor, cnn: torch.Tensor,
                frames_major: bool = False, lanes: bool = False, fused: bool = False,
                own: bool = False) -> torch.Tensor:
        """x ``[b, t, C]``; ``frames_major``: the conv block's channels-last layout; ``lanes``: q/k/v side by
        side; ``fused``: each modulation and gated residual in one kernel; ``own`` (with ``fused``): the five
        512-wide linears by :func:`.linears.linear`, the attention's output and the MLP's second layer with their
        gated residuals (all checked per GPU, see :meth:`DiT.fast`)."""
        if fused:
            return self._fused(x, m, kv, cnn, lanes, own)
        # modulate(x, shift, scale) = x * (1 + scale) + shift, with (1 + scale) precomputed
        x = x + m.gate[0] * self.attn(self.norm1(x) * m.scale1[0] + m.shift[0], kv, lanes)
        if frames_major:
            x = x + m.gate[2] * self.conv.forward_frames_major(self.norm3(x) * m.scale1[2], m.shift[2], cnn)
        else:
            x = x + m.gate[2] * self.conv(self.norm3(x) * m.scale1[2] + m.shift[2], cnn)
        return x + m.gate[1] * self.mlp(self.norm2(x) * m.scale1[1] + m.shift[1])

    def _fused(self, x: torch.Tensor, m: Modulation, kv: torch.Tensor, cnn: torch.Tensor, lanes: bool,
               own: bool = False) -> torch.Tensor:
        """:meth:`forward` with :func:`.fused.mul_add` for ``a * b + c`` (the same roundings, one kernel each);
        ``own``: the q/k/v projections, and the attention's output projection and the MLP's second layer each
        with its gated residual, by :func:`.linears.linear`."""
        heads = self.attn.attend(mul_add(self.norm1(x), m.scale1[0], m.shift[0]), kv, lanes, own)
        proj = self.attn.proj
        x = linears.linear(heads, proj.weight_t, proj.bias, m.gate[0], x) if own else mul_add(proj(heads), m.gate[0], x)
        y2 = self.conv.forward_fused(self.norm3(x), m.scale1[2], m.shift[2], cnn, lanes)     # [b, C, t], no bias
        x = mul_add(y2.transpose(1, 2), m.gate[2], x, bias=self.conv.block[6].bias)
        h = mul_add(self.norm2(x), m.scale1[1], m.shift[1])
        if own:
            fc2 = self.mlp.fc2
            return linears.linear(self.mlp.hidden(h), fc2.weight_t, fc2.bias, m.gate[1], x)
        return mul_add(self.mlp(h), m.gate[1], x)


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int):
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))
        self.norm_final = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, out_channels)

    def modulation(self, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return shift, 1 + scale

    def forward(self, x: torch.Tensor, shift: torch.Tensor, scale1: torch.Tensor, fused: bool = False) -> torch.Tensor:
        if fused:
            return self.linear(mul_add(self.norm_final(x), scale1, shift))
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
        #: per chunk length (frames): the self-checks' verdicts on the faster paths (see :meth:`fast`)
        self.checked = CheckedPaths("step-audio2 DiT", FAST_PATHS, self._trial, self._trial_inputs, _not_applicable,
                                    captured_only, self._prepare)

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
        self.checked.clear()
        for blk in self.blocks:
            blk.conv.weights_cl = []
            blk.drop_transposed()

    # -- faster paths, checked per GPU ---------------------------------------------------------------
    def fast(self, t: int) -> Dict[str, bool]:
        """Which faster paths (:data:`FAST_PATHS`) run for a ``t``-frame chunk.

        Each is decided once per length by :func:`engine.fastpath.self_check` (cuDNN and cuBLAS pick kernels
        per shape, layout and stream, so per length): one DiT block (block 0's weights) with the path off and
        on, from the same fresh random input and caches, ``torch.equal`` on the output and both caches, run as
        production runs it (eagerly, and on CUDA also captured and replayed; the fused kernel only captured).
        The checks run before any capture (the executor's warm-up precedes every capture); a length first met
        inside a capture runs the reference paths.
        """
        return self.checked.which(t, self.in_proj.weight.device, self.cfg)

    def _prepare(self, path: str) -> None:
        """What a chosen path reads, for every block, made once when a length's check chooses it (before any
        capture): the convs' channels-last filters, the split-K linears' transposed weights."""
        for blk in self.blocks:
            if path == "frames-major convs" and not blk.conv.weights_cl:
                blk.conv.build_layouts()
            elif path == "split-K linears" and not blk.has_transposed():
                blk.build_transposed()

    @torch.no_grad()
    def _trial_inputs(self, t: int, path: str) -> List[torch.Tensor]:
        """Seeded random input, caches and (before the constants exist) modulations for :meth:`_trial`."""
        blk, dev, c = self.blocks[0], self.in_proj.weight.device, self.cfg.hidden
        g = torch.Generator().manual_seed(1000 + t)
        x = torch.randn(2, t, c, generator=g).to(dev)
        kv = torch.randn(2, self.cfg.heads, t + 3, 2 * self.cfg.head_dim, generator=g).to(dev)
        cnn = torch.randn(2, 2 * c, blk.conv.pad, generator=g).to(dev)
        if path == "frames-major convs" and not blk.conv.weights_cl:
            blk.conv.build_layouts()
        if path == "split-K linears" and not blk.has_transposed():
            blk.build_transposed()
        mod = [] if self.mods else [torch.randn(2, 1, c, generator=g).to(dev) for _ in range(9)]
        return [x, kv, cnn, *mod]

    @torch.no_grad()
    def _trial(self, t: int, path: str, on: bool, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        """Block 0 (and the final layer after it) over :meth:`_trial_inputs`, ``path`` off or on (the other
        paths off)."""
        blk = self.blocks[0]
        x, kv, cnn, *mod = inputs
        m = self.mods[0][0] if self.mods else Modulation(mod[0:3], mod[3:6], mod[6:9])
        fused = on and path in TRITON_PATHS
        out = blk(x, m, kv, cnn, frames_major=on and path == "frames-major convs",
                  lanes=on and path == "parallel lanes", fused=fused, own=on and path == "split-K linears")
        if not self.final_mods:
            return [out, kv, cnn]
        return [out, self.final_layer(out, *self.final_mods[0], fused=fused), kv, cnn]

    def verdicts(self) -> List[Verdict]:
        """The checks made so far (for the session info)."""
        return self.checked.verdicts()

    def forward(self, xin: torch.Tensor, step: int, kv: torch.Tensor, cnn: torch.Tensor) -> torch.Tensor:
        """xin ``(2, 320, t)``; ``kv`` ``(depth, 2, h, t + T0, 2d)``; ``cnn`` ``(depth, 2, 2C, 2)``.

        Returns the velocity ``(2, 80, t)`` (a transposed view, as the stock returns it).
        """
        x = self.in_proj(xin.transpose(1, 2))                                 # (2, t, C)
        mods = self.mods[step]
        fast = self.fast(x.shape[1])
        fused = fast["fused elementwise"] and fused_worth_it(x.device)
        own = fused and fast["split-K linears"]
        for i, blk in enumerate(self.blocks):
            x = blk(x, mods[i], kv[i], cnn[i], fast["frames-major convs"], fast["parallel lanes"], fused, own)
        shift, scale1 = self.final_mods[step]
        return self.final_layer(x, shift, scale1, fused).transpose(1, 2)
