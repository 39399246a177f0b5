"""The LLM's one-token forward as CUDA graphs *between* attention calls, with exact-length attention.

A decode step's shapes are the same at every position except inside attention, whose key/value length
grows by one each token; a graph per length would never recur, and a padded cache with a mask would
change the bits. So the step is cut at attention: per layer, one graph holds everything from the
previous layer's attention output to this layer's query (o_proj, residual, MLP, the next norm, q/k/v
projections, q/k norms, RoPE from a device-side position, and the key/value write at that position),
and attention runs eagerly in between over the exact ``[:n]`` view of the demand-sized store, the same
kernels the stock path runs. 37 graphs, captured once, replay every single-token forward (the decode
steps and the ``<unit>`` feed) at any position; the per-token host cost drops from ~1,100 kernel
launches to 37 replays and 36 attention calls.

:meth:`LayerGraphs.forward` without CUDA runs the same segments eagerly (the CPU tests check they
give the bits of :meth:`Qwen3.forward`).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

from engine.core.gate import GATE
from engine.core.graphs import GraphRuntime

from . import gqa
from .kv import DemandKV
from .layers import attend, causal_mask, norm_then_rope, rope_tables
from .llm import Qwen3


class LayerGraphs:
    """``tokens``-token forwards of ``llm`` over ``kv`` (a :class:`~.kv.DemandKV`), graphed per layer.

    ``tokens`` 1: a decode step or a one-token feed, the head's logits inside the last graph. More: a feed of
    that many new positions (LISTEN's ``</unit>`` close and its 10 audio embeddings), the segments' kernels
    those of the eager forward at that width, attention eager under the eager path's causal mask; the final
    hidden states only (the caller takes the logits as the stock does, over every row)."""

    def __init__(self, llm: Qwen3, kv: DemandKV, device: torch.device, capture: bool,
                 head: Optional[torch.nn.Linear] = None, tokens: int = 1,
                 runtime: Optional[GraphRuntime] = None):
        # ``llm``: any decoder with ``.model.layers`` / ``.model.norm`` and dims ``.d`` (the Qwen3 LLM, or the
        # TTS, whose ``head`` is its code head instead of ``lm_head``); ``runtime``: a pool shared with other
        # widths' graphs whose forwards never interleave with these (default: a pool of their own)
        self.llm, self.kv, self.device = llm, kv, torch.device(device)
        self.head = head if head is not None else llm.lm_head
        # the LLM's logits stay in its dtype (the stock samples bfloat16 logits on CUDA); the TTS's code
        # logits are float32, as the stock's TTS writes them into a float buffer
        self.logits_dtype = self.head.weight.dtype if head is None else torch.float32
        d = llm.d
        dt = self.head.weight.dtype
        self.t = t = int(tokens)
        self.x_in = torch.zeros(1, t, d.hidden, dtype=dt, device=self.device)          # [1, t, hidden]
        self.pos = torch.zeros(t, dtype=torch.long, device=self.device)                 # [t] positions
        self._steps = torch.arange(t, dtype=torch.long, device=self.device)             # 0 .. t-1
        self.att = [torch.zeros(1, d.heads, t, d.head_dim, dtype=dt, device=self.device) for _ in range(d.layers)]
        self.graphs: List[torch.cuda.CUDAGraph] = []
        self.outs: List[Tuple[torch.Tensor, ...]] = []
        self.buffers = (kv.k_buf.data_ptr(), kv.v_buf.data_ptr())
        self.attend = ExactAttention(llm, kv)
        self.replays = 0
        self.runtime = runtime or GraphRuntime(self.device, f"layer graphs: {type(llm).__name__} x{t}")
        if capture:
            self._capture()
        # the TTS's one query on its own lane, replayed in a lean loop: per layer the graph, then the attention
        # kernels over the static query and straight into the next graph's input (ExactAttention.into's ops)
        self._lane = ([(g, self.outs[i][1][0], self.attend.kt[i], self.attend.v3[i], self.att[i][0])
                       for i, g in enumerate(self.graphs[:-1])] if self.graphs and t == 1 and self.attend.lane
                      else None)
        self._scale = d.head_dim ** -0.5

    # -- the segments (the pieces below, shared with exact_graphs.py) ----------------------------------
    def _segment(self, s: int):
        """Segment ``s`` of the step: 0 = the step's RoPE tables and the first layer's pre; s = post(s-1) +
        pre(s); last = post + head. The tables are made once per step, as the stock's rotary embedding makes
        them once per forward, and every later segment reads segment 0's (``outs[0][2:]``)."""
        d = self.llm.d
        if s == 0:
            cos, sin = rope_tables(self.pos, d.head_dim, d.rope_theta, self.x_in.dtype)
            return self.x_in, layer_pre(self.llm, self.kv, 0, self.x_in, cos, sin, self.pos), cos, sin
        x = layer_post(self.llm, s - 1, self.outs[s - 1][0], self.att[s - 1])
        if s == d.layers:
            return final_outputs(self.llm, self.head, x, self.logits_dtype)
        return x, layer_pre(self.llm, self.kv, s, x, *self.outs[0][2:], self.pos)

    # -- capture and run ------------------------------------------------------------------------------
    def _capture(self) -> None:
        """Warm every segment up for real on the runtime's side stream, then capture each (one gate
        hold for all of them: a capture that has to upgrade a shared second does so once)."""
        torch.add(self._steps, self.kv.length, out=self.pos)    # warm-up writes land where the next real ones will
        capture_segments(self, self.llm.d.layers + 1)

    def valid_for(self, kv) -> bool:
        """Whether these graphs write into ``kv``'s current buffers (a grown store needs new graphs)."""
        return kv is self.kv and self.buffers == (kv.k_buf.data_ptr(), kv.v_buf.data_ptr())

    def forward(self, embed: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``t`` embeddings [t, hidden] at positions ``kv.length`` on -> (final hidden [t, hidden], logits
        [1, V] for one token, else None)."""
        kv, t = self.kv, self.t
        n = kv.length + t
        if n > kv.capacity:
            raise RuntimeError("the LLM store is full: regrow it before replaying")
        if embed.shape[0] != t:
            raise ValueError(f"these layer graphs take {t} embeddings, not {embed.shape[0]}")
        self.x_in.copy_(embed.view(1, t, -1))
        torch.add(self._steps, kv.length, out=self.pos)
        mask = causal_mask(t, n, self.device)
        layers = self.llm.d.layers
        if self._lane is not None and mask is None:
            self._replay_lane(n)
            return self._done(t)
        run_segments(self, layers + 1, lambda s: self.attend.into(s, self.outs[s][1], n, mask, self.att[s]))
        return self._done(t)

    def _replay_lane(self, n: int) -> None:
        """Every layer's graph, each followed by the one query's attention over ``n`` positions (the ops of
        :meth:`ExactAttention.into`, with the scores scaled in place), then the last graph; host-bound past the
        TTS's room, so nothing else runs per layer."""
        scale = self._scale
        for g, q0, kt, v3, o0 in self._lane:
            g.replay()
            one_query_into(q0, kt, v3, n, scale, o0)
        self.graphs[-1].replay()
        self.runtime.count(len(self.graphs))

    def _done(self, t: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        self.kv.commit(t)
        self.replays += 1
        h = self.outs[-1][0]
        return h.clone(), (self.outs[-1][1].clone() if t == 1 else None)



# -- segments between attention calls, shared with the group step's graphs (:mod:`.group_graphs`) ---------
def capture_segments(owner, count: int) -> None:
    """``owner``'s ``count`` segments (``owner._segment(s)``, each reading the outputs of those before it from
    ``owner.outs``) warmed up for real on its runtime's side stream, then each captured (one gate hold for all of
    them: a capture that has to upgrade a shared second does so once) into ``owner.graphs``."""
    rt = owner.runtime
    with GATE.capturing():
        with rt.side():
            for s in range(count):                           # warm-up, for real, segment by segment
                owner.outs.append(tuple(t.clone() for t in owner._segment(s)))
        for s in range(count):
            g, out = rt.capture(lambda: owner._segment(s))
            owner.graphs.append(g)
            owner.outs[s] = out


def run_segments(owner, count: int, between: Callable[[int], None]) -> None:
    """``owner``'s segments in order, each replayed (or run eagerly where it holds no graphs: the CPU), with
    ``between(s)`` (the attention calls) after every segment but the last."""
    for s in range(count):
        if owner.graphs:
            owner.runtime.replay(owner.graphs[s])
        else:
            owner.outs = owner.outs[:s] + [owner._segment(s)] if s else [owner._segment(0)]
        if s < count - 1:
            between(s)


# -- the step's pieces, shared with the whole-forward graphs of :mod:`.exact_graphs` ------------------------
def layer_pre(llm, kv, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor
              ) -> torch.Tensor:
    """Layer ``i`` up to attention over ``x`` [1, t, hidden]: the query [1, H, t, hd]; its keys and values
    written into ``kv``'s storage at positions ``pos`` [t]."""
    layer = llm.model.layers[i]
    a, t = layer.self_attn, x.shape[1]
    h = layer.input_layernorm(x)
    q = a.q_proj(h).view(1, t, a.h, a.hd)
    k = a.k_proj(h).view(1, t, a.hkv, a.hd)
    v = a.v_proj(h).view(1, t, a.hkv, a.hd).transpose(1, 2)                           # [1, Hkv, t, hd]
    q = norm_then_rope(a.q_norm, q, cos, sin)                                           # [1, H, t, hd]
    k = norm_then_rope(a.k_norm, k, cos, sin)                                           # [1, Hkv, t, hd]
    kv.k_buf[i].index_copy_(1, pos, k[0])
    kv.v_buf[i].index_copy_(1, pos, v[0])
    return q


def layer_post(llm, i: int, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """Layer ``i`` after attention ``att`` [1, H, t, hd]: o_proj, residual, MLP -> the residual stream."""
    layer = llm.model.layers[i]
    a, t = layer.self_attn, x.shape[1]
    x = x + a.o_proj(att.transpose(1, 2).reshape(1, t, a.h * a.hd))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def final_outputs(llm, head: torch.nn.Linear, x: torch.Tensor, logits_dtype: torch.dtype) -> Tuple[torch.Tensor, ...]:
    """The final norm's hidden states [t, hidden]; for one token also the head's logits [1, V]."""
    h = llm.model.norm(x)[0]                                                            # [t, hidden]
    if x.shape[1] > 1:
        return (h,)
    return h, head(h[-1].view(1, -1)).to(logits_dtype)                                  # [1, V]


class ExactAttention:
    """Eager attention of layer ``i`` over exactly ``n`` positions of ``kv``'s storage, with the stock path's
    kernels (SDPA for the LLM, the written-out sequence for the TTS) on the stock's operands, in few host
    operations: the replayed forward's host time is these calls (36 a token). Each layer's storage views are made
    once (the owners make new ones when the store moves); grouped-query keys and values are widened by one
    broadcasting copy into a fresh tensor, the values and layout ``repeat_interleave`` gives (6 dispatches for
    its 15); the TTS's written-out attention of one query is the two ``bmm`` calls that ``matmul`` makes of it."""

    def __init__(self, llm, kv):
        a = llm.model.layers[0].self_attn
        self.h, self.hkv, self.hd, self.explicit = a.h, a.hkv, a.hd, a.explicit
        self.group = a.h // a.hkv
        layers = range(len(llm.model.layers))
        self.k = [kv.k_buf[i:i + 1] for i in layers]                                  # [1, Hkv, capacity, hd]
        self.v = [kv.v_buf[i:i + 1] for i in layers]
        # one query over the grouped heads as they are, over the histories where the device's self-check proved
        # it (gqa.py: up to ``grouped_up_to`` positions)
        self.grouped_up_to = gqa.up_to(kv.k_buf.device) if self.group > 1 and not self.explicit else 0
        self.grouped = self.grouped_up_to > 0
        self.kg, self.vg = self.k, self.v
        if self.group > 1:                                                              # [1, Hkv, 1, capacity, hd]
            self.k, self.v = [x.unsqueeze(2) for x in self.k], [x.unsqueeze(2) for x in self.v]
        # the written-out one-query lane's operands, made once: k^T [H, hd, capacity] and v [H, capacity, hd]
        # (the very views _one_query makes of the [:n] slices, before narrowing)
        self.lane = self.explicit and self.group == 1
        self.kt = [kv.k_buf[i].transpose(1, 2) for i in layers] if self.lane else []
        self.v3 = [kv.v_buf[i] for i in layers] if self.lane else []

    def __call__(self, i: int, q: torch.Tensor, n: int, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if n <= self.grouped_up_to and mask is None and q.shape[2] == 1:
            return gqa.grouped(q, self.kg[i].narrow(2, 0, n), self.vg[i].narrow(2, 0, n))
        if self.group > 1:
            k, v = gqa.widen(self.k[i], n, self.group), gqa.widen(self.v[i], n, self.group)
        else:
            k, v = self.k[i].narrow(2, 0, n), self.v[i].narrow(2, 0, n)
        if self.explicit and mask is None and q.shape[2] == 1:
            return self._one_query(q, k, v)
        return attend(q, k, v, mask, self.explicit)

    def into(self, i: int, q: torch.Tensor, n: int, mask: Optional[torch.Tensor], out: torch.Tensor) -> None:
        """``self(i, q, n, mask)`` written into ``out`` [1, H, t, hd]. The TTS's one query (written out, no
        grouped heads) runs :meth:`_one_query`'s kernels on the same operands with the second product written
        straight into ``out``: 5 kernels and 7 host calls a layer instead of 6 and ~13 (the between-attention
        step past a reply's prepared room is host-bound: 2.89 ms against 2.20 replayed whole, H200)."""
        if not (self.lane and mask is None and q.shape[2] == 1):
            out.copy_(self(i, q, n, mask))
            return
        one_query_into(q[0], self.kt[i], self.v3[i], n, q.shape[-1] ** -0.5, out[0])

    @staticmethod
    def _one_query(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """:func:`~.layers.explicit_attention` without a mask, for q [1, H, 1, hd]: the same batched products,
        scale, float32 softmax and cast, on the same [H, ...] operands ``matmul`` reshapes to."""
        scores = torch.bmm(q[0], k[0].transpose(1, 2)) * (q.shape[-1] ** -0.5)
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.bmm(weights, v[0]).unsqueeze(0)


def one_query_into(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, n: int, scale: float, out: torch.Tensor
                   ) -> None:
    """The written-out attention of one query (:meth:`ExactAttention._one_query`'s kernels) over the first ``n``
    positions, written into ``out`` [H, 1, hd]: q [H, 1, hd], kt the keys transposed [H, hd, capacity], v the
    values [H, capacity, hd]; the scores scaled in place (the same rounding as a new tensor)."""
    scores = torch.bmm(q, kt.narrow(2, 0, n)).mul_(scale)
    torch.bmm(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v.narrow(1, 0, n), out=out)


def make_layer_graphs(llm: Qwen3, kv, device, want: bool, tokens: int = 1) -> Optional[LayerGraphs]:
    """Layer graphs of ``tokens`` positions for a demand store on CUDA (None otherwise: the eager path runs)."""
    dev = torch.device(device)
    if not want or not isinstance(kv, DemandKV) or dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return LayerGraphs(llm, kv, dev, capture=True, tokens=tokens)
