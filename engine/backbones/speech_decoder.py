"""An autoregressive speech-token decoder (Llama blocks) that runs one token per engine step.

Written gpt-fast style: ``DecoderArgs`` presets by name, a plain module, and a KV cache allocated
once — here it is an engine region, a :class:`~engine.core.regions.Ring` of ``context`` slots that
every step writes at ``position % context`` (a device-side offset) and attends over in full with a
mask of the slots written so far. The shapes never change, so one CUDA graph replays every token.

The ``released`` preset has the sizes of a released duplex model's TTS decoder (Llama: hidden 768, 20 layers, 12 heads,
FFN 3072); ``tiny`` keeps the same structure at toy width for CPUs and tests. Weights are seeded
random: the timing and memory are real, the tokens are not speech.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.graphs import example_randn, session_generator
from engine.core import Clock, Region, Ring, SessionSpec, StateView, StepPlan, StreamingModel


@dataclass(frozen=True)
class DecoderArgs:
    dim: int = 768
    n_layers: int = 20
    n_heads: int = 12
    ffn: int = 3072
    context: int = 1024          # KV ring slots (tokens the decoder attends over)
    vocab: int = 6561            # per codebook, set from the tail
    codebooks: int = 1
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    temperature: float = 0.8

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


PRESETS: Dict[str, DecoderArgs] = {
    "released": DecoderArgs(),                                            # a released TTS decoder's sizes
    "tiny": DecoderArgs(dim=64, n_layers=2, n_heads=4, ffn=256, context=128),
}


def decoder_args(size: str, vocab: int, codebooks: int) -> DecoderArgs:
    if size not in PRESETS:
        raise ValueError(f"unknown decoder size {size!r}; choose one of: {', '.join(PRESETS)}")
    return replace(PRESETS[size], vocab=int(vocab), codebooks=int(codebooks))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, Llama's half-split layout. x: [1, H, 1, D]; cos/sin: [D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    """Pre-norm Llama block: attention over the KV ring, SwiGLU feed-forward."""

    def __init__(self, a: DecoderArgs):
        super().__init__()
        self.h, self.hd = a.n_heads, a.head_dim
        self.attn_norm = RMSNorm(a.dim, a.norm_eps)
        self.wqkv = nn.Linear(a.dim, 3 * a.dim, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.w1 = nn.Linear(a.dim, a.ffn, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn, bias=False)
        self.w2 = nn.Linear(a.ffn, a.dim, bias=False)

    def forward(self, x, k_ring, v_ring, slot, cos, sin, mask):
        # x: [1, 1, dim]; k_ring/v_ring: [H, C, hd] views of the layer's ring; slot: [1] int64
        q, k, v = self.wqkv(self.attn_norm(x)).split(x.shape[-1], dim=-1)
        q = rotate(q.view(1, 1, self.h, self.hd).transpose(1, 2), cos, sin)      # [1, H, 1, hd]
        k = rotate(k.view(1, 1, self.h, self.hd).transpose(1, 2), cos, sin)      # [1, H, 1, hd]
        v = v.view(1, 1, self.h, self.hd).transpose(1, 2)                        # [1, H, 1, hd]
        k_ring.index_copy_(1, slot, k[0])
        v_ring.index_copy_(1, slot, v[0])
        att = F.scaled_dot_product_attention(q, k_ring.unsqueeze(0), v_ring.unsqueeze(0), attn_mask=mask)
        x = x + self.wo(att.transpose(1, 2).reshape(1, 1, -1))                   # [1, 1, dim]
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class SpeechDecoder(StreamingModel):
    """The AR decoder as an engine model: one token in (an embedding), one token sampled out.

    Step inputs: ``x`` [1, 1, dim] (an audio embedding while listening, the previous token's
    embedding while speaking). Outputs: ``tok`` [codebooks] int64 (Gumbel-max sample from the
    device's default generator) and ``next`` [1, 1, dim], the sampled token's embedding.
    """

    name = "speech-decoder"

    def __init__(self, args: DecoderArgs, seed: int = 0):
        super().__init__()
        a = self.args = args
        self.clock = Clock("tokens", (1,), rate_hz=0.0)
        self.tok_emb = nn.Embedding(a.codebooks * a.vocab, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.head = nn.Linear(a.dim, a.codebooks * a.vocab, bias=False)
        self.bos = nn.Parameter(torch.zeros(1, 1, a.dim))
        self.register_buffer("inv_freq", a.rope_base ** (-torch.arange(0, a.head_dim, 2).float() / a.head_dim),
                             persistent=False)
        self.register_buffer("slots", torch.arange(a.context), persistent=False)
        self.register_buffer("book_offset", torch.arange(a.codebooks) * a.vocab, persistent=False)
        self._init_weights(seed)

    def _init_weights(self, seed: int) -> None:
        g = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    continue
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    # -- engine contract ---------------------------------------------------------------------------
    def regions(self, spec: SessionSpec) -> List[Region]:
        a = self.args
        shape = (a.n_layers, a.n_heads, None, a.head_dim)
        note = "HF DynamicCache: torch.cat per token, unbounded"
        return [Region("k", shape, self.clock, Ring(a.context), stock_note=note, doc="keys after RoPE"),
                Region("v", shape, self.clock, Ring(a.context), stock_note=note, doc="values")]

    def session_spec(self) -> SessionSpec:
        return SessionSpec(steps=None, label="speech decoder")

    def example_inputs(self, plan: StepPlan, device) -> Dict[str, torch.Tensor]:
        return {"x": example_randn((1, 1, self.args.dim), device)}

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        a = self.args
        x = inputs["x"]                                            # [1, 1, dim]
        pos = state["k"].position()                                # 0-d int64 (device): tokens so far
        slot = (pos % a.context).view(1)                           # [1]
        ang = pos.to(torch.float32) * self.inv_freq                # [hd/2]
        cos, sin = torch.cos(ang), torch.sin(ang)
        # slots written so far (all of them once the ring has wrapped): [1, 1, 1, C] bool
        mask = ((self.slots <= pos) | (pos >= a.context)).view(1, 1, 1, a.context)
        k_all, v_all = state["k"].get(), state["v"].get()          # [L, H, C, hd]
        for i, layer in enumerate(self.layers):
            x = layer(x, k_all[i], v_all[i], slot, cos, sin, mask)
        logits = self.head(self.norm(x)).view(a.codebooks, a.vocab) / a.temperature   # [K, V]
        u = torch.rand(a.codebooks, a.vocab, device=x.device, generator=session_generator(x.device)).clamp_(min=1e-20)
        tok = torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)                   # [K] int64
        nxt = self.embed(tok)                                                           # [1, 1, dim]
        return {"tok": tok, "next": nxt}

    def embed(self, tok: torch.Tensor) -> torch.Tensor:
        """Sum of the codebooks' embeddings. tok: [K] int64 -> [1, 1, dim]."""
        return self.tok_emb(tok + self.book_offset).sum(dim=0).view(1, 1, -1)
