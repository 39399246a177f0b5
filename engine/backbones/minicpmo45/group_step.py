"""One LLM step for a group of sessions: their one-token rows through the layer stack together, each row's bits
its own session's (docs/design-cross-session-llm.md).

A one-token forward reads every weight of the 8B LLM once; S sessions stepping apart read them S times. Here the
S rows meet the big linears as one GEMM of S rows — where :func:`check_rows` proved on this device that a GEMM of
S rows gives every row the bits of that row alone (cuBLAS picks its kernel by the row count: on the H200 the down
projection keeps them up to 8 rows, the lm_head at none) — and run one row at a time where it did not. The rest
is each session's own: its input norms, q/k norms and RoPE at its own position, the key/value write into its own
store, attention over exactly its own history, the final norm and the lm_head over its one row, the very calls of
:meth:`.llm.Qwen3.forward` on a ``[1, 1, hidden]`` row. The elementwise work between (residual adds, SiLU times
up) runs over all rows: an elementwise kernel gives each element the same bits at any shape.

Built and checked on the CPU (tests/test_minicpmo45_group_step.py); the rounds that bring phase-aligned hosted
sessions' forwards together, the graphs of the batched segments and the host's mode are not built yet (the design
note says how).
"""
from __future__ import annotations

from typing import Dict, FrozenSet, List, Sequence, Tuple

import torch
import torch.nn.functional as F

from .kv import KVStore
from .layers import apply_rope, attend, rope_tables
from .llm import Qwen3

#: the layer linears a group step may batch, by their names in a decoder layer
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
Verdicts = Dict[str, FrozenSet[int]]          # linear name -> the row counts proven on this device


def _weight(llm: Qwen3, name: str) -> torch.Tensor:
    block = llm.model.layers[0]
    return getattr(block.self_attn if hasattr(block.self_attn, name) else block.mlp, name).weight


def check_rows(llm: Qwen3, counts: Sequence[int], seed: int = 0) -> Verdicts:
    """For each layer linear and each row count ``r`` in ``counts``: is one GEMM over ``r`` fresh random rows
    ``torch.equal`` to the ``r`` rows one at a time, on this device with this weight's shape and dtype? The
    kernel is picked by shape and dtype, the same in every layer, so layer 0's weights stand for all."""
    g = torch.Generator(device=llm.lm_head.weight.device).manual_seed(int(seed))
    out: Verdicts = {}
    with torch.no_grad():
        for name in LINEARS:
            w = _weight(llm, name)
            ok = set()
            for r in counts:
                x = torch.randn(int(r), 1, w.shape[1], generator=g, device=w.device).to(w.dtype)
                alone = torch.cat([F.linear(x[i:i + 1], w) for i in range(int(r))])
                if int(r) == 1 or torch.equal(F.linear(x, w), alone):
                    ok.add(int(r))
            out[name] = frozenset(ok)
    return out


def _linear(x: torch.Tensor, module: torch.nn.Linear, name: str, verdicts: Verdicts) -> torch.Tensor:
    """``x`` [S, 1, in] through ``module``: one GEMM where S rows are proven, else one row at a time."""
    if x.shape[0] in verdicts.get(name, frozenset({1})):
        return module(x)
    return torch.cat([module(x[i:i + 1]) for i in range(x.shape[0])])


def _attention(layer, i: int, h: torch.Tensor, stores: Sequence[KVStore], tables, verdicts: Verdicts
               ) -> torch.Tensor:
    """Layer ``layer``'s attention for the normed rows ``h`` [S, 1, hidden] -> its o_proj output [S, 1, hidden]:
    the projections over all rows, then per session the steps of :meth:`.layers.Attention.forward` between its
    projections and ``o_proj``. (Those steps belong in one method of ``Attention`` that both call; that split
    waits for the GPU run that wires this step in, since the GPU-proven session code goes through ``forward``.)"""
    a = layer.self_attn
    q_all, k_all, v_all = (_linear(h, getattr(a, n), n, verdicts) for n in ("q_proj", "k_proj", "v_proj"))
    outs = []
    for s, store in enumerate(stores):
        cos, sin = tables[s]
        q = a.q_norm(q_all[s:s + 1].view(1, 1, a.h, a.hd))
        k = a.k_norm(k_all[s:s + 1].view(1, 1, a.hkv, a.hd))
        v = v_all[s:s + 1].view(1, 1, a.hkv, a.hd).transpose(1, 2)
        keys, values = store.layer(i).append(apply_rope(k.transpose(1, 2), cos, sin), v)
        if a.hkv != a.h:
            keys = keys.repeat_interleave(a.h // a.hkv, dim=1)
            values = values.repeat_interleave(a.h // a.hkv, dim=1)
        o = attend(apply_rope(q.transpose(1, 2), cos, sin), keys, values, None, a.explicit)
        outs.append(o.transpose(1, 2).reshape(1, 1, a.h * a.hd))
    return _linear(torch.cat(outs), a.o_proj, "o_proj", verdicts)


def group_forward(llm: Qwen3, stores: Sequence[KVStore], embeds: torch.Tensor, verdicts: Verdicts
                  ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """One token for each of S sessions: ``embeds`` [S, hidden] (row s: session s's), ``stores[s]`` its store.
    Each store gets its key/value written at its own length and committed. -> per session (final hidden
    [1, hidden], logits [1, vocab]): the bits of ``llm(embeds[s:s+1], stores[s])`` and ``llm.logits`` of it."""
    d = llm.d
    if embeds.shape[0] != len(stores):
        raise ValueError(f"a group step takes one row per session: {embeds.shape[0]} rows, {len(stores)} stores")
    tables = [rope_tables(torch.tensor([st.length], device=embeds.device), d.head_dim, d.rope_theta, embeds.dtype)
              for st in stores]
    x = embeds.unsqueeze(1)                                                     # [S, 1, hidden]
    for i, layer in enumerate(llm.model.layers):
        h = torch.cat([layer.input_layernorm(x[s:s + 1]) for s in range(len(stores))])
        x = x + _attention(layer, i, h, stores, tables, verdicts)
        h = torch.cat([layer.post_attention_layernorm(x[s:s + 1]) for s in range(len(stores))])
        mlp = layer.mlp
        act = F.silu(_linear(h, mlp.gate_proj, "gate_proj", verdicts)) * _linear(h, mlp.up_proj, "up_proj", verdicts)
        x = x + _linear(act, mlp.down_proj, "down_proj", verdicts)
    out = []
    for s, store in enumerate(stores):
        store.commit(1)
        hidden = llm.model.norm(x[s:s + 1])[0]                                  # [1, hidden]
        out.append((hidden, llm.logits(hidden)))
    return out
