"""The LLM's whole forward at one exact position as one CUDA graph, captured the second before it runs.

A forward of ``t`` tokens starting at position ``p`` attends over exactly ``p + t`` positions in every layer,
so its shapes are those of no other forward: the layer graphs of :mod:`.llm_graphs` replay everything but
attention and run the 36 attention calls eagerly in between (~1,000 host operations a token). But the
declared clocks say which forwards the next second makes before it starts: LISTEN closes the last unit
(its terminator and ``</unit>``: 2 tokens at the store's length ``L``), feeds ``<unit>`` (1 at ``L + 2``)
and the second's audio tokens (``a`` at ``L + 3``); THINK then feeds at most one token per slot from
``L + 3 + a`` on (one more where a barge-in closes the reply first). :func:`next_forwards` lists them, and
:class:`ExactForwards` captures each as one graph — every layer, attention at its exact length — in the
time between seconds, so the second replays one graph per forward.

The graph holds the very operations of the layer-graph path in the same order (:func:`whole_forward`: RoPE
tables, per layer the pre-attention segment, exact-length attention, the post-attention segment; the final
norm and head): the same kernels at the same shapes, so the same bits, which the GPU tests check against the
stock-like eager path. A forward nobody prepared (the store moved, the ahead work was cut short) falls back
to the layer graphs. Without CUDA an entry holds no graph and :meth:`ExactForwards.run` runs
:func:`whole_forward` eagerly (the CPU tests check its bits and the bookkeeping).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from engine.core.gate import GATE
from engine.core.graphs import GraphRuntime

from .layers import causal_mask, rope_tables
from .llm_graphs import ExactAttention, final_outputs, layer_post, layer_pre

Key = Tuple[int, int]          # (tokens, start position)


def next_forwards(length: int, close: int, audio: int, slots: int) -> List[Key]:
    """The (tokens, start) of every LLM forward the next second may make, the store holding ``length``
    positions now: LISTEN's close (``close`` tokens, 0 when no unit is open), ``<unit>`` and ``audio`` audio
    tokens; then one token per THINK slot (``slots`` of them, plus one for a barge-in's ``<|turn_eos|>``)."""
    out: List[Key] = []
    p = int(length)
    if close:
        out.append((int(close), p))
        p += int(close)
    out += [(1, p), (int(audio), p + 1)]
    p += 1 + int(audio)
    out += [(1, p + k) for k in range(int(slots) + 1)]
    return out


def whole_forward(llm, kv, head, x: torch.Tensor, start: int, logits_dtype: torch.dtype,
                  attention: Optional[ExactAttention] = None) -> Tuple[torch.Tensor, ...]:
    """``x`` [1, t, hidden] at positions ``start`` .. ``start + t - 1`` through every layer of ``llm`` over
    ``kv``'s storage (keys and values written there), attention over exactly ``start + t`` positions;
    -> (final hidden [t, hidden], logits [1, V] for one token). ``attention``: ``kv``'s (made here when None)."""
    d, t = llm.d, x.shape[1]
    attention = attention or ExactAttention(llm, kv)
    n = start + t
    pos = torch.arange(start, n, dtype=torch.long, device=x.device)
    cos, sin = rope_tables(pos, d.head_dim, d.rope_theta, x.dtype)
    mask = causal_mask(t, n, x.device)
    q = layer_pre(llm, kv, 0, x, cos, sin, pos)
    for i in range(d.layers):
        x = layer_post(llm, i, x, attention(i, q, n, mask))
        if i + 1 < d.layers:
            q = layer_pre(llm, kv, i + 1, x, cos, sin, pos)
    return final_outputs(llm, head, x, logits_dtype)


class _Width:
    """The buffers every forward of ``t`` tokens shares: the input rows and the outputs the graphs write."""

    def __init__(self, t: int, hidden: int, vocab: int, dtype: torch.dtype, device):
        self.x_in = torch.zeros(1, t, hidden, dtype=dtype, device=device)
        self.h_out = torch.zeros(t, hidden, dtype=dtype, device=device)
        self.logits_out = torch.zeros(1, vocab, dtype=dtype, device=device) if t == 1 else None   # the LLM's dtype
        self.warm = False            # a forward of this width ran for real on the side stream


class ExactForwards:
    """Whole forwards of the LLM at exact (tokens, start) keys over one store's storage, one graph each."""

    def __init__(self, llm, kv, device):
        self.llm, self.kv, self.device = llm, kv, torch.device(device)
        self.head = llm.lm_head
        self.dtype = self.head.weight.dtype
        self.graphed = self.device.type == "cuda" and torch.cuda.is_available()
        self.buffers = (kv.k_buf.data_ptr(), kv.v_buf.data_ptr())
        self.attention = ExactAttention(llm, kv)
        self.widths: Dict[int, _Width] = {}
        self.entries: Dict[Key, Optional[torch.cuda.CUDAGraph]] = {}
        self._spent: List[torch.cuda.CUDAGraph] = []     # replayed this second: freed at the next prepare
        self.runtime = GraphRuntime(self.device, f"exact forwards: {type(llm).__name__}")
        self.hits = 0                # forwards served by an entry
        self.misses = 0              # forwards asked for with no entry (the layer graphs ran them)

    def valid_for(self, kv) -> bool:
        """Whether the entries write into ``kv``'s current buffers (a moved store needs new ones)."""
        return kv is self.kv and self.buffers == (kv.k_buf.data_ptr(), kv.v_buf.data_ptr())

    def _width(self, t: int) -> _Width:
        w = self.widths.get(t)
        if w is None:
            d = self.llm.d
            w = self.widths[t] = _Width(t, d.hidden, self.head.weight.shape[0], self.dtype, self.device)
        return w

    def _body(self, w: _Width, start: int) -> None:
        out = whole_forward(self.llm, self.kv, self.head, w.x_in, start, self.dtype, self.attention)
        w.h_out.copy_(out[0])
        if w.logits_out is not None:
            w.logits_out.copy_(out[1])

    def prepare(self, keys: List[Key]) -> int:
        """Entries for ``keys`` not yet held, in order; drops the entries that start before the store's length (positions only grow) and the graphs this second replayed (the
        second is over: its audio came back to the host). Returns how many were made."""
        if self._spent and self.graphed:
            torch.cuda.current_stream(self.device).synchronize()
        self._spent.clear()
        for key in [k for k in self.entries if k[1] < self.kv.length]:
            del self.entries[key]
        made = 0
        for t, start in keys:
            if (t, start) in self.entries or start + t > self.kv.capacity or start < self.kv.length:
                continue
            self.entries[(t, start)] = self._capture(t, start) if self.graphed else None
            made += 1
        return made

    def _capture(self, t: int, start: int) -> "torch.cuda.CUDAGraph":
        """One forward captured (its first width warmed up for real first: its writes land at positions the
        second overwrites before anything reads them)."""
        w, rt = self._width(t), self.runtime
        with GATE.capturing():
            if not w.warm:
                with rt.side():
                    self._body(w, start)
                w.warm = True
            graph, _ = rt.capture(lambda: self._body(w, start))
        return graph

    def run(self, embed: torch.Tensor) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """``embed`` [t, hidden] at the store's length through the entry made for it -> (final hidden
        [t, hidden], logits [1, V] or None); None when there is none (the caller runs it otherwise)."""
        t, start = int(embed.shape[0]), self.kv.length
        key = (t, start)
        if key not in self.entries:
            self.misses += 1
            return None
        w = self._width(t)
        w.x_in.copy_(embed.view(1, t, -1))
        graph = self.entries.pop(key)               # a position is fed once: its entry is spent
        if graph is not None:
            self.runtime.replay(graph)
            self._spent.append(graph)               # kept until the replay has surely finished
        else:
            self._body(w, start)
        self.kv.commit(t)
        self.hits += 1
        return w.h_out.clone(), (w.logits_out.clone() if w.logits_out is not None else None)
