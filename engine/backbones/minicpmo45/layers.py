"""Building blocks shared by the LLM (Qwen3) and the TTS (Llama): RMSNorm, RoPE, GQA attention, SwiGLU.

Every block reads and writes its key/value history through a ``KVLayer`` (see :mod:`.kv`): the stock
policy grows it with ``torch.cat``; the demand policy writes into storage allocated once and hands
back an exact-length view. The arithmetic is the same in both: attention always runs over exactly
the positions written so far (no padding, no mask beyond causality), so both give the same bits.
"""
from __future__ import annotations

import functools

from typing import Optional, Protocol, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import exact, norm_rope


class KVLayer(Protocol):
    def append(self, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Store ``k``/``v`` [1, Hkv, T, hd] after the history; return the whole history [1, Hkv, L, hd]."""


class RMSNorm(nn.Module):
    """RMS norm computed in float32, scaled in the model's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if exact.use_fused(x) and norm_rope.rms_norm_fits(x, self.weight):     # in a capture, proven here
            return norm_rope.rms_norm(x, self.weight, self.eps)
        return rms_norm_stock(x, self.weight, self.eps)


def rms_norm_stock(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The stock's RMSNorm: the mean of squares in float32, the scaled rows back in ``x``'s dtype, times
    ``weight`` (eight kernels on CUDA; :mod:`engine.kernels.norm_rope` has the same bits in three)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


@functools.lru_cache(maxsize=None)
def inverse_frequencies(head_dim: int, theta: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """RoPE's inverse frequencies [hd/2] in float32 on ``device``, as the stock's rotary buffer holds them:
    ``theta ** (-2i/hd)`` computed on the CPU in float32 when the model is built, then cast with the model to
    its dtype (the demo's ``model.bfloat16()`` casts that buffer too: on CUDA the frequencies are bfloat16
    values), read back as float32 for the angles. Made once per device (outside any graph capture: the first
    forward is an eager warm-up)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim))
    return inv.to(dtype).to(torch.float32).to(device)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, hd] for integer ``positions`` [T] (half-split layout, angles in float32; the frequencies
    are :func:`inverse_frequencies` for a model in ``dtype``)."""
    inv = inverse_frequencies(int(head_dim), float(theta), dtype, positions.device)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]          # [T, hd/2]
    ang = torch.cat([ang, ang], dim=-1)                                 # [T, hd]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [1, H, T, hd]; cos/sin: [T, hd]. Inside a capture on a device that proved it, one fused kernel with
    the stock chain's bits (:mod:`engine.kernels.norm_rope`)."""
    if exact.use_fused(x) and norm_rope.rope_fits(x, cos, sin):
        return norm_rope.rope(x, cos, sin)
    return apply_rope_stock(x, cos, sin)


def norm_then_rope(norm: Optional["RMSNorm"], x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """A projection's heads ``x`` [1, T, H, hd] through its per-head norm (Qwen3's q/k norm; None: none), then
    RoPE -> [1, H, T, hd]. Inside a capture on a device that proved it, the norm's last kernel also turns."""
    if norm is None:
        return apply_rope(x.transpose(1, 2), cos, sin)
    if exact.use_fused(x) and norm_rope.rms_norm_rope_fits(x, norm.weight, cos, sin):
        return norm_rope.rms_norm_rope(x, norm.weight, norm.eps, cos, sin)
    return apply_rope(norm(x).transpose(1, 2), cos, sin)


def apply_rope_stock(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The stock's rotate-half RoPE: ``x * cos + cat(-x2, x1) * sin`` (five kernels on CUDA)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


def pin_attention_kernels(device) -> None:
    """Keep cuDNN's fused attention out of this process's ``scaled_dot_product_attention`` on CUDA.

    PyTorch prefers cuDNN attention on Hopper once cuDNN is newer than 9.15 (torch 2.11 + cuDNN 9.19 on
    the H200 picks it for every attention call here), and cuDNN's forward does not repeat its own bits:
    on the H200 a single-token attention over more than ~256 positions came out different between two
    runs of the same session (docs/bit-identity.md), so no mode, the stock-like one
    included, could repeat a session. PyTorch's own deterministic mode refuses cuDNN attention for this
    reason. Without it the dispatcher takes the flash forward (no mask) or the memory-efficient one
    (masked prefill), both deterministic. Process-wide and set once, before anything is captured, like
    ``cudnn.deterministic`` in the Step-Audio2 tail; fp32 models (that tail) never used cuDNN attention."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def causal_mask(t_new: int, t_all: int, device) -> Optional[torch.Tensor]:
    """Boolean [t_new, t_all] mask: new token i sees history plus new tokens 0..i (None for one token)."""
    if t_new == 1:
        return None
    past = t_all - t_new
    rows = torch.arange(t_new, device=device)[:, None]
    cols = torch.arange(t_all, device=device)[None, :]
    return cols <= rows + past


def run_stack(layers: nn.ModuleList, embeds: torch.Tensor, kv, head_dim: int, theta: float) -> torch.Tensor:
    """Decoder layers over ``embeds`` [T, hidden] at positions kv.length .. kv.length+T-1 (then committed
    to ``kv``, a KVStore); returns the last layer's output [1, T, hidden] (before the final norm)."""
    t, start, dev = embeds.shape[0], kv.length, embeds.device
    cos, sin = rope_tables(torch.arange(start, start + t, device=dev), head_dim, theta, embeds.dtype)
    mask = causal_mask(t, start + t, dev)
    x = embeds.unsqueeze(0)                                                       # [1, T, hidden]
    for i, layer in enumerate(layers):
        x = layer(x, kv.layer(i), cos, sin, mask)
    kv.commit(t)
    return x


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None
                       ) -> torch.Tensor:
    """Attention written out: scores ``q k^T`` times ``1/sqrt(hd)``, the causal mask added (-inf where a query
    may not look), a float32 softmax over the keys, then the weighted sum of the values. The stock's TTS runs
    exactly this sequence (its Llama under ``attn_implementation="eager"``); SDPA's fused kernel sums in
    another order. q: [1, H, T, hd]; k, v: [1, H, L, hd]; mask: bool [T, L] or None -> [1, H, T, hd]."""
    scores = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5)
    if attn_mask is not None:
        scores = scores + torch.zeros(attn_mask.shape, dtype=scores.dtype, device=scores.device).masked_fill(
            ~attn_mask, float("-inf"))
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], explicit: bool
           ) -> torch.Tensor:
    """Causal attention as the stock's decoder runs it. ``explicit`` (the TTS's eager Llama): the written-out
    sequence under ``mask``. Otherwise (Qwen3 under SDPA) transformers' rule for when a causal mask is needed:
    a feed with no history before it (``mask`` square) runs SDPA's own ``is_causal`` without a mask, any other
    feed of several tokens the explicit mask, one token none. On CUDA they are different kernels (flash vs
    memory-efficient) that round differently: the H200 run against the stock loop showed it at the prelude.
    q: [1, H, T, hd]; k, v: [1, H, L, hd]; mask: bool [T, L] or None."""
    if explicit:
        return explicit_attention(q, k, v, attn_mask=mask)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()           # as transformers hands them to SDPA
    if mask is not None and mask.shape[0] == mask.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE; ``qk_norm`` adds Qwen3's per-head RMSNorm on q and k;
    ``explicit`` computes it step by step (:func:`explicit_attention`) instead of through SDPA."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, eps: float, qk_norm: bool,
                 explicit: bool = False):
        super().__init__()
        self.h, self.hkv, self.hd = heads, kv_heads, head_dim
        self.explicit = explicit
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def forward(self, x: torch.Tensor, kv: KVLayer, cos: torch.Tensor, sin: torch.Tensor,
                mask: Optional[torch.Tensor]) -> torch.Tensor:
        # x: [1, T, dim]
        t = x.shape[1]
        q = self.q_proj(x).view(1, t, self.h, self.hd)
        k = self.k_proj(x).view(1, t, self.hkv, self.hd)
        v = self.v_proj(x).view(1, t, self.hkv, self.hd).transpose(1, 2)     # [1, Hkv, T, hd]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)                             # [1, H, T, hd]
        k = apply_rope(k.transpose(1, 2), cos, sin)                             # [1, Hkv, T, hd]
        k_all, v_all = kv.append(k, v)                                          # [1, Hkv, L, hd]
        if self.hkv != self.h:
            rep = self.h // self.hkv
            k_all = k_all.repeat_interleave(rep, dim=1)                         # [1, H, L, hd]
            v_all = v_all.repeat_interleave(rep, dim=1)
        out = attend(q, k_all, v_all, mask, self.explicit)
        return self.o_proj(out.transpose(1, 2).reshape(1, t, self.h * self.hd))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder block (names as in the released checkpoint: ``self_attn``, ``mlp``, two norms)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, ffn: int, eps: float, qk_norm: bool,
                 explicit: bool = False):
        super().__init__()
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = Attention(dim, heads, kv_heads, head_dim, eps, qk_norm, explicit)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = SwiGLU(dim, ffn)

    def forward(self, x, kv: KVLayer, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), kv, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Projector(nn.Module):
    """Two linear layers with a ReLU between (``linear1``, ``linear2``: the audio and semantic projectors)."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.linear1 = nn.Linear(d_in, d_out)
        self.linear2 = nn.Linear(d_out, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(F.relu(self.linear1(x)))


def seeded_init(module: nn.Module, seed: int, std: float = 0.02) -> None:
    """Seeded random weights (norm weights stay 1, biases 0), drawn on the module's own device."""
    dev = next(module.parameters()).device
    g = torch.Generator(device=dev).manual_seed(int(seed))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name:
                p.fill_(1.0) if name.endswith("weight") else p.zero_()
            elif name.endswith("bias"):
                p.zero_()
            else:
                # the float32 draw rounded into the parameter, then scaled in place: the bits of
                # ``randn(...).to(dtype) * std`` without its two extra parameter-sized temporaries (the
                # 1.2 GiB lm_head's copy and product broke a 22 GiB cap while the released model built)
                p.copy_(torch.randn(p.shape, generator=g, device=dev, dtype=torch.float32))
                p.mul_(std)
