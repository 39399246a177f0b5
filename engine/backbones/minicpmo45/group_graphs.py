"""The one-token LLM step of a group of sessions as layer graphs over all their rows (run by :mod:`.batched_llm`).

:class:`~.llm_graphs.LayerGraphs` replays one session's one-token forward as 37 graphs with exact-length attention
eagerly between them. :class:`GroupGraphs` does the same for ``S`` sessions at once: each graph runs the segment
between two attention calls over the ``S`` rows — the input norm, the q/k/v projections, the q/k norms, RoPE at
each row's own position, each row's key and value written into its own session's store at that store's length,
then after attention the o projection, the residual, the MLP and the next norm — and attention runs eagerly per
session over exactly its own history (its own :class:`~.llm_graphs.ExactAttention`). The last graph takes the
final norm over all rows; the lm_head runs after it for each present row alone (no row count keeps its bits on the
H200).

Bits: a linear runs as one GEMM of ``S`` rows only where :func:`check_rows` proved it on this device for that
weight and count (else in consecutive chunks of a proven count, one row at a time where none is); norms, RoPE and
the elementwise work are per row (``torch.equal`` at 2-32 rows on the H200). :func:`check` runs the whole step against each
session's own layer graphs on fresh random histories at different lengths, every output and every byte of every
store, before a host lets a group of that size use it.

Without CUDA the segments run eagerly (the CPU tests check them against each session's own forward).
"""
from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from engine.core.graphs import GraphRuntime
from engine.core.hostcopy import device_ids

from .kv import DemandKV
from .layers import apply_rope, rope_tables
from .llm import Qwen3
from .llm_graphs import ExactAttention, LayerGraphs, capture_segments, run_segments


#: the layer linears a group step may batch, by their names in a decoder layer
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
Verdicts = Dict[str, FrozenSet[int]]          # linear name -> the row counts proven on this device


def _weight(llm: Qwen3, name: str) -> torch.Tensor:
    block = llm.model.layers[0]
    return getattr(block.self_attn if hasattr(block.self_attn, name) else block.mlp, name).weight


#: output elements a row count's verdict compares at least (trials of fresh rows until then, at most
#: :data:`ROW_TRIALS_MOST`): a GEMM whose kernel sums in another order than one row alone rounds to the same bf16
#: nearly always, so one trial can pass it where it is in fact another kernel (a CPU's bf16 GEMM of a 64-wide
#: weight: 2 rows differed from one at a time in 2 of 200 trials, 3 rows of a 32-wide one about once in 10^5
#: outputs). 2^21 outputs (the released LLM's q projection at 8 rows: 64 trials) leave such a kernel ~20 chances.
ROW_CHECK_ELEMENTS = 1 << 21
ROW_TRIALS_MOST = 4096


def row_trials(rows: int, width: int) -> int:
    """Trials of ``rows`` fresh rows through a weight ``width`` outputs wide for one verdict."""
    return max(1, min(ROW_TRIALS_MOST, -(-ROW_CHECK_ELEMENTS // (int(rows) * int(width)))))


def check_rows(llm: Qwen3, counts: Sequence[int], seed: int = 0) -> Verdicts:
    """For each layer linear and each row count ``r`` in ``counts``: is one GEMM over ``r`` fresh random rows
    ``torch.equal`` to the ``r`` rows one at a time, on this device with this weight's shape and dtype, in every one
    of :func:`row_trials` trials? The kernel is picked by shape and dtype, the same in every layer, so layer 0's
    weights stand for all."""
    g = torch.Generator(device=llm.lm_head.weight.device).manual_seed(int(seed))
    with torch.no_grad():
        return {name: _counts_equal(_weight(llm, name), sorted({int(r) for r in counts}), g) for name in LINEARS}


def _counts_equal(w: torch.Tensor, counts: Sequence[int], g: torch.Generator) -> FrozenSet[int]:
    """The row counts whose GEMMs equal one row at a time through ``w``: one pool of fresh rows, each row once
    alone; each count's trials take consecutive rows of it (so the one-row launches are shared by every count)."""
    ok = {r for r in counts if r == 1}
    many = [r for r in counts if r > 1]
    if not many:
        return frozenset(ok)
    need = max(r * row_trials(r, w.shape[0]) for r in many)
    pool = torch.randn(need, 1, w.shape[1], generator=g, device=w.device).to(w.dtype)
    alone = torch.cat([F.linear(pool[i:i + 1], w) for i in range(need)])
    for r in many:
        n = r * row_trials(r, w.shape[0])
        together = torch.cat([F.linear(pool[j:j + r], w) for j in range(0, n, r)])
        if torch.equal(together, alone[:n]):
            ok.add(r)
    return frozenset(ok)


def rows_through(x: torch.Tensor, module: torch.nn.Linear, name: str, verdicts: Verdicts) -> torch.Tensor:
    """``x`` [S, 1, in] through ``module``: one GEMM where S rows are proven, else consecutive chunks, each as
    many rows as the largest count proven that fits (one row at a time where none is), in row order."""
    n, ok = x.shape[0], verdicts.get(name, frozenset({1}))
    if n in ok:
        return module(x)
    parts, i = [], 0
    while i < n:
        r = max((c for c in ok if c <= n - i), default=1)
        parts.append(module(x[i:i + r]))
        i += r
    return torch.cat(parts)


def group_pre(llm: Qwen3, stores: Sequence[DemandKV], i: int, x: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, pos: torch.Tensor, verdicts: Verdicts) -> torch.Tensor:
    """Layer ``i`` up to attention for the rows ``x`` [S, 1, hidden] at positions ``pos`` [S] (tables ``cos`` /
    ``sin`` [S, 1, 1, hd]): the queries [S, H, 1, hd]; row ``s``'s key and value written into ``stores[s]``."""
    layer = llm.model.layers[i]
    a, n = layer.self_attn, x.shape[0]
    h = layer.input_layernorm(x)
    q = rows_through(h, a.q_proj, "q_proj", verdicts).view(n, 1, a.h, a.hd)
    k = rows_through(h, a.k_proj, "k_proj", verdicts).view(n, 1, a.hkv, a.hd)
    v = rows_through(h, a.v_proj, "v_proj", verdicts).view(n, 1, a.hkv, a.hd).transpose(1, 2)    # [S, Hkv, 1, hd]
    q = apply_rope(a.q_norm(q).transpose(1, 2), cos, sin)                                     # [S, H, 1, hd]
    k = apply_rope(a.k_norm(k).transpose(1, 2), cos, sin)                                     # [S, Hkv, 1, hd]
    for s, store in enumerate(stores):
        at = pos.narrow(0, s, 1)
        store.k_buf[i].index_copy_(1, at, k[s])
        store.v_buf[i].index_copy_(1, at, v[s])
    return q


def group_post(llm: Qwen3, i: int, x: torch.Tensor, att: torch.Tensor, verdicts: Verdicts) -> torch.Tensor:
    """Layer ``i`` after attention ``att`` [S, H, 1, hd]: o projection, residual, MLP -> [S, 1, hidden]."""
    layer = llm.model.layers[i]
    a, mlp, n = layer.self_attn, layer.mlp, x.shape[0]
    x = x + rows_through(att.transpose(1, 2).reshape(n, 1, a.h * a.hd), a.o_proj, "o_proj", verdicts)
    h = layer.post_attention_layernorm(x)
    act = F.silu(rows_through(h, mlp.gate_proj, "gate_proj", verdicts)) \
        * rows_through(h, mlp.up_proj, "up_proj", verdicts)
    return x + rows_through(act, mlp.down_proj, "down_proj", verdicts)


def group_final(llm: Qwen3, x: torch.Tensor) -> Tuple[torch.Tensor]:
    """The final norm over the rows [S, 1, hidden] -> (hidden [S, hidden],); the head runs per present row after
    the graphs (:meth:`GroupGraphs.forward`): no row count keeps the lm_head's bits on the H200, and an absent
    row's head would read the 1.2 GB weight for nothing."""
    return (llm.model.norm(x)[:, 0],)


class GroupGraphs:
    """One-token forwards of ``len(stores)`` sessions through ``llm`` together, graphed between attention calls."""

    def __init__(self, llm: Qwen3, stores: Sequence[DemandKV], device, verdicts: Verdicts, capture: bool):
        d = llm.d
        self.llm, self.stores, self.verdicts = llm, list(stores), verdicts
        self.device = torch.device(device)
        n, dt = len(self.stores), llm.lm_head.weight.dtype
        self.x_in = torch.zeros(n, 1, d.hidden, dtype=dt, device=self.device)
        self.pos = torch.zeros(n, dtype=torch.long, device=self.device)
        self.att = [torch.zeros(n, d.heads, 1, d.head_dim, dtype=dt, device=self.device) for _ in range(d.layers)]
        self.attend = [ExactAttention(llm, st) for st in self.stores]
        self.buffers = [(st.k_buf.data_ptr(), st.v_buf.data_ptr()) for st in self.stores]
        self.graphs: List[torch.cuda.CUDAGraph] = []
        self.outs: List[Tuple[torch.Tensor, ...]] = []
        self.runtime = GraphRuntime(self.device, f"group graphs: {n} sessions")
        self.replays = 0
        self._member_views: Optional[List[List[Tuple[torch.Tensor, torch.Tensor]]]] = None
        if capture:
            self._capture()
            self._member_views = [[(self.outs[s][1].narrow(0, m, 1), self.att[s].narrow(0, m, 1))
                                   for m in range(n)] for s in range(d.layers)]

    def _segment(self, s: int):
        """Segment ``s``: 0 = the rows' RoPE tables and the first layer's pre; then post(s-1) + pre(s); the last
        is post + the final norm and head (as :meth:`.llm_graphs.LayerGraphs._segment`, over all rows)."""
        d, n = self.llm.d, len(self.stores)
        if s == 0:
            cos, sin = rope_tables(self.pos, d.head_dim, d.rope_theta, self.x_in.dtype)
            cos, sin = cos.view(n, 1, 1, -1), sin.view(n, 1, 1, -1)
            return (self.x_in, group_pre(self.llm, self.stores, 0, self.x_in, cos, sin, self.pos, self.verdicts),
                    cos, sin)
        x = group_post(self.llm, s - 1, self.outs[s - 1][0], self.att[s - 1], self.verdicts)
        if s == d.layers:
            return group_final(self.llm, x)
        return x, group_pre(self.llm, self.stores, s, x, *self.outs[0][2:], self.pos, self.verdicts)

    def _capture(self) -> None:
        """Every segment warmed up for real on the side stream, then captured (one gate hold for all). Where every
        store has a sink the warm-up writes there (a member's own work may be writing its store meanwhile)."""
        sinks = all(getattr(st, "sink", None) is not None for st in self.stores)
        self._set_positions([False] * len(self.stores) if sinks else None)
        capture_segments(self, self.llm.d.layers + 1)

    def _set_positions(self, here: Optional[Sequence[bool]] = None) -> List[int]:
        """Each row's write position into ``pos``: a present member's length, an absent one's sink."""
        lengths = [st.length for st in self.stores]
        at = lengths if here is None else [n if p else st.sink for n, p, st in zip(lengths, here, self.stores)]
        self.pos.copy_(device_ids(at, self.device))
        return lengths

    def valid_for(self, stores: Sequence[DemandKV]) -> bool:
        """Whether these graphs write into exactly these stores' current buffers."""
        return (len(stores) == len(self.stores) and all(a is b for a, b in zip(stores, self.stores))
                and self.buffers == [(st.k_buf.data_ptr(), st.v_buf.data_ptr()) for st in stores])

    def _presence(self, present: Optional[Sequence[bool]]) -> List[bool]:
        n = len(self.stores)
        here = [True] * n if present is None else [bool(p) for p in present]
        if len(here) != n or not any(here):
            raise ValueError(f"a round of this group of {n} needs one flag per member and a member present, "
                             f"got {present!r}")
        for st, p in zip(self.stores, here):
            if p and st.length + 1 > st.capacity:
                raise RuntimeError("a member's LLM store is full: regrow it (and capture again) before the step")
            if not p and getattr(st, "sink", None) is None:
                raise ValueError("a member absent from a round needs a store with a sink (make_store(sink=True))")
        return here

    def forward(self, embeds: torch.Tensor, present: Optional[Sequence[bool]] = None
                ) -> List[Optional[Tuple[torch.Tensor, torch.Tensor]]]:
        """Row ``s`` of ``embeds`` [S, hidden] at ``stores[s]``'s length -> per session (final hidden [1, hidden],
        logits [1, V]); each store commits its one position. ``present`` (default: all): members absent from this
        round get None; their rows (any values: zeros from a round) still run through the row-wise segments, their
        keys and values go to their stores' sinks, no attention runs for them, and their stores do not commit.
        The positions live in device memory, so every presence pattern replays the same graphs."""
        n = len(self.stores)
        if embeds.shape[0] != n:
            raise ValueError(f"a group step of {n} sessions takes {n} rows, not {embeds.shape[0]}")
        self.x_in.copy_(embeds.view(n, 1, -1))
        return self._run(self._presence(present))

    def step(self, rows: Dict[int, torch.Tensor]) -> List[Optional[Tuple[torch.Tensor, torch.Tensor]]]:
        """:meth:`forward` with the present members' rows given by seat (``{seat: [1, hidden]}``), each written
        straight into the graphs' input; the absent seats' rows keep whatever they held (rows never mix)."""
        for m, e in rows.items():
            self.x_in[m].copy_(e.view(1, -1))
        return self._run(self._presence([m in rows for m in range(len(self.stores))]))

    def _views(self, s: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Segment ``s``'s query and attention output per member: made once where the graphs keep their outputs
        in place (captured), else from this step's eager outputs."""
        if self._member_views is not None:
            return self._member_views[s]
        q = self.outs[s][1]
        return [(q.narrow(0, m, 1), self.att[s].narrow(0, m, 1)) for m in range(len(self.stores))]

    def _run(self, here: List[bool]) -> List[Optional[Tuple[torch.Tensor, torch.Tensor]]]:
        n = len(self.stores)
        lengths = self._set_positions(here)
        members = [(m, att, lengths[m] + 1) for m, (att, p) in enumerate(zip(self.attend, here)) if p]

        def attention(s: int) -> None:
            views = self._views(s)
            for m, att, length in members:
                q, out = views[m]
                att.into(s, q, length, None, out)
        run_segments(self, self.llm.d.layers + 1, attention)
        for st, p in zip(self.stores, here):
            if p:
                st.commit(1)
        self.replays += 1
        h = self.outs[-1][0]
        head = self.llm.lm_head
        return [(h[m:m + 1].clone(), head(h[m:m + 1])) if here[m] else None for m in range(n)]


def check(llm: Qwen3, make_store, device, sessions: int, verdicts: Verdicts, graphs: bool,
          seed: int = 0, absent: Sequence[int] = (), own_graphs: Optional[bool] = None) -> Tuple[bool, str]:
    """The group step of ``sessions`` sessions against each session's own layer graphs (``own_graphs``, default
    ``graphs``: captured, or their segments run eagerly — the same kernels), on this device: fresh
    random histories of different lengths (``make_store()`` gives an empty store, with a sink where ``absent``
    is not empty), one fresh row each; every hidden state, every logit and every byte of every store must be
    identical. Members in ``absent`` sit the round out: their stores must come out unchanged below their sinks.
    (ok, why)."""
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    dt, hidden = llm.lm_head.weight.dtype, llm.d.hidden
    away = {int(a) for a in absent}
    pairs = []
    with torch.no_grad():
        for s in range(int(sessions)):
            history = torch.randn(3 + 5 * s + int(torch.randint(0, 7, (1,), generator=g)), hidden, generator=g)
            alone, together = make_store(), make_store()
            for st in (alone, together):
                llm(history.to(dev, dt), st)
            pairs.append((alone, together))
        rows = torch.randn(int(sessions), hidden, generator=g).to(dev, dt)
        before = {s: (pairs[s][1].k_buf.clone(), pairs[s][1].v_buf.clone(), pairs[s][1].length) for s in away}
        own = graphs if own_graphs is None else bool(own_graphs)
        want = [None if s in away else LayerGraphs(llm, alone, dev, capture=own).forward(rows[s:s + 1])
                for s, (alone, _) in enumerate(pairs)]
        got = GroupGraphs(llm, [t for _, t in pairs], dev, verdicts, capture=graphs).forward(
            rows, [s not in away for s in range(int(sessions))])
    bad = _first_difference(pairs, want, got, before)
    if bad is not None:
        return False, f"session {bad[0]} of {sessions}: {bad[1]}"
    batched = sorted(name for name, counts in verdicts.items() if int(sessions) in counts)
    sat_out = f", {len(away)} sitting the round out untouched" if away else ""
    return True, (f"{sessions} sessions{sat_out}: identical to each session's own step "
                  f"(one GEMM over the rows for {', '.join(batched) or 'no linear'}; the rest row by row)")


def _first_difference(pairs, want, got, before) -> Optional[Tuple[int, str]]:
    """The first member whose group-step results or store differ from its own step's (or, absent, from its
    store before the round): (member, why); None when every one matches."""
    for s, (a, b) in enumerate(pairs):
        if s in before:
            k0, v0, n0 = before[s]
            cap = b.capacity
            if got[s] is not None or b.length != n0 or not (torch.equal(k0[:, :, :cap], b.k_buf[:, :, :cap])
                                                            and torch.equal(v0[:, :, :cap], b.v_buf[:, :, :cap])):
                return s, "absent from the round, yet its store changed below its sink (or it got results)"
            continue
        (h0, l0), (h1, l1), n = want[s], got[s], a.length
        if not (torch.equal(h0, h1) and torch.equal(l0, l1)):
            return s, "the group step's hidden state or logits differ from its own"
        if not (b.length == n and torch.equal(a.k_buf[:, :, :n], b.k_buf[:, :, :n])
                and torch.equal(a.v_buf[:, :, :n], b.v_buf[:, :, :n])):
            return s, "the group step wrote other keys or values"
    return None
