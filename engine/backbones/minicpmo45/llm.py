"""THINK's language model: Qwen3 (36 layers, hidden 4096, GQA 32/8, head_dim 128, untied lm_head).

A plain module in the checkpoint's names (``model.embed_tokens``, ``model.layers.N``, ``model.norm``,
``lm_head``; stored under ``llm.``). :meth:`Qwen3.forward` takes embeddings of ``T`` new positions and
the session's KV store and returns the final-norm hidden state of every new position; the caller asks
for the logits of the last one only (the duplex protocol never needs more), computed as the stock does.
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from engine.core.hostcopy import device_ids

from .dims import LLMDims
from .kv import KVStore
from .layers import DecoderLayer, RMSNorm, run_stack


class _Body(nn.Module):
    def __init__(self, d: LLMDims):
        super().__init__()
        self.embed_tokens = nn.Embedding(d.vocab, d.hidden)
        self.layers = nn.ModuleList(
            DecoderLayer(d.hidden, d.heads, d.kv_heads, d.head_dim, d.ffn, d.eps, qk_norm=True)
            for _ in range(d.layers))
        self.norm = RMSNorm(d.hidden, d.eps)


class Qwen3(nn.Module):
    """The duplex LLM; its key/value history lives in a :class:`~.kv.KVStore` the caller owns."""

    def __init__(self, d: LLMDims):
        super().__init__()
        self.d = d
        self.model = _Body(d)
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)

    def embed(self, ids: List[int]) -> torch.Tensor:
        """Token embeddings [T, hidden] for a list of ids."""
        w = self.model.embed_tokens.weight
        return self.model.embed_tokens(device_ids(ids, w.device))          # no stream sync for the ids

    def forward(self, embeds: torch.Tensor, kv: KVStore) -> torch.Tensor:
        # embeds: [T, hidden] -> hidden states after the final norm [T, hidden]
        x = run_stack(self.model.layers, embeds, kv, self.d.head_dim, self.d.rope_theta)    # [1, T, hidden]
        return self.model.norm(x)[0]                                              # [T, hidden]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [1, vocab] of the last of a feed's hidden states [T, hidden] (or one, [hidden]), in the LLM's
        own dtype (bfloat16 on CUDA), as the stock samples them.

        As the stock's ``StreamDecoder.feed(..., return_logits=True)``: ``lm_head`` over every position of
        the feed, then the last row; one row alone would be another matrix product (other bits)."""
        return self.lm_head(hidden.reshape(1, -1, self.d.hidden))[:, -1]
