"""THINK's speech generator: the MiniCPM-o 4.5 TTS (Llama 20 x 768) with its conditioning and code head.

Per speaking second the TTS reads a *condition*: for every text token the LLM produced after
``<|speak|>``, ``emb_text(token) + L2norm(projector_semantic(LLM hidden))`` (4096 -> 768 -> 768),
then the ``emb_text`` embedding of the audio-BOS id. It prefills the condition at the turn's current
position, then decodes 26 steps, each feeding the previous code through ``emb_code``: 25 codes for
token2wav (the 26th is drawn and dropped, as the stock does). Its key/value history lasts one turn.

Graph replay: a decode step's shapes depend only on how many positions the turn's KV holds, and those
positions recur every turn. :class:`DecodeGraphs` keeps one CUDA graph per KV length over a
:class:`~.kv.DemandKV` (stable addresses, exact-length views), captured ahead of time up to the turn
length the turn policy allows. Past it (a long reply, or a history carried over cut replies, as the stock
keeps it) the session's idle time between seconds captures the next second's lengths (:meth:`DecodeGraphs.ahead`,
the live worker's default); a length with no graph runs through graphs between the attention calls, valid at
every length. Sampling stays outside the graph (it is the same code in every mode, so the draws are the same).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.gate import GATE
from engine.core.graphs import GraphRuntime
from engine.core.hostcopy import device_ids

from .dims import LLMDims, TTSDims
from .kv import DemandKV, KVStore
from .layers import DecoderLayer, Projector, RMSNorm, run_stack
from .llm_graphs import LayerGraphs


class _Body(nn.Module):
    def __init__(self, d: TTSDims):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(d.hidden, d.heads, d.kv_heads, d.head_dim, d.ffn, d.eps, qk_norm=False, explicit=True)
            for _ in range(d.layers))
        self.norm = RMSNorm(d.hidden, d.eps)


class TTS(nn.Module):
    """The TTS decoder in the checkpoint's names (``emb_text``, ``emb_code.0``, ``head_code.0``,
    ``model.layers.N``, ``model.norm``, ``projector_semantic``). ``head_code.0.weight`` is the
    weight-normed head already folded (see :func:`~.weights.fold_weight_norm`)."""

    def __init__(self, d: TTSDims, llm: LLMDims):
        super().__init__()
        self.d = d
        self.emb_text = nn.Embedding(d.text_vocab, d.hidden)
        self.emb_code = nn.ModuleList([nn.Embedding(d.codes, d.hidden)])
        self.head_code = nn.ModuleList([nn.Linear(d.hidden, d.codes, bias=False)])
        self.model = _Body(d)
        self.projector_semantic = Projector(llm.hidden, d.hidden)

    def condition(self, tokens: List[int], hidden: Optional[torch.Tensor]) -> torch.Tensor:
        """The second's condition [n + 1, hidden]: text + semantic per token, then audio BOS."""
        dev = self.emb_text.weight.device
        bos = self.emb_text(device_ids([self.d.audio_bos], dev))                                # [1, hidden]
        if not tokens:
            return bos
        text = self.emb_text(device_ids(tokens, dev))                                           # [n, hidden]
        sem = F.normalize(self.projector_semantic(hidden), p=2.0, dim=-1)                         # [n, hidden]
        return torch.cat([text + sem, bos], dim=0)

    def forward(self, embeds: torch.Tensor, kv: KVStore) -> torch.Tensor:
        # embeds: [T, hidden] at turn positions kv.length .. kv.length + T - 1 -> float32 logits [1, codes]
        # the code head over every position, then the last row (as the stock's generate_chunk: one row alone
        # would be another matrix product, other bits, whenever the condition is longer than one position)
        x = run_stack(self.model.layers, embeds, kv, self.d.head_dim, self.d.rope_theta)    # [1, T, hidden]
        return self.head_code[0](self.model.norm(x))[:, -1].float()             # [1, codes]

    def step_code(self, code: torch.Tensor, kv: KVStore) -> torch.Tensor:
        """One decode step: the previous code [1] (device int64) -> logits [1, codes]."""
        return self.forward(self.emb_code[0](code), kv)


class DecodeGraphs:
    """One CUDA graph per TTS KV length for the decode step (no padding: exact-length attention).

    The graphs read the KV store's storage where it is when they are captured: when the store grows (a
    history carried over cut replies outgrew its room) they are dropped, and every step from then on
    runs through the between-attention graphs of :meth:`_layered` over the new storage."""

    def __init__(self, tts: TTS, device: torch.device, recurring: Optional[int] = None):
        self.tts = tts
        self.device = device
        # lengths a turn reaches again and again (a reply's own room): only those are worth a capture;
        # a history carried over cuts runs past them once, eagerly (None: capture every length)
        self.recurring = recurring
        self.graphs: Dict[int, tuple] = {}
        self.runtime = GraphRuntime(device, "tts decode")     # one pool for the per-length graphs
        self.captures = 0
        self.replays = 0
        self.grown: Optional[int] = None      # the store's growth count the graphs were captured at
        self.layered: Optional[LayerGraphs] = None   # past the room: graphs between attention calls

    def _follow(self, kv) -> None:
        """Drop every graph when the store moved to new storage since they were captured."""
        grown = getattr(kv, "grown", 0)
        if self.grown != grown:
            self.graphs.clear()
            self.runtime.drop_pool()
            self.grown = grown

    def capture(self, kv, length: int, warm: bool) -> None:
        """Capture the step that makes the KV hold ``length`` positions (KV at ``length - 1`` now)."""
        saved = kv.length
        code = torch.zeros(1, dtype=torch.long, device=self.device)
        try:
            with GATE.capturing():                            # warm-up and capture in one hold
                if warm:                                      # run once for real on the side stream
                    with self.runtime.side():
                        kv.length = length - 1
                        self.tts.step_code(code, kv)
                kv.length = length - 1
                g, out = self.runtime.capture(lambda: self.tts.step_code(code, kv))
        finally:
            kv.length = saved
        self.graphs[length] = (g, code, out)
        self.captures += 1

    def prepare(self, kv, up_to: int) -> None:
        """Ahead of time (before the session's first turn), over an empty KV: lengths 2..up_to; and, where the
        store has room past them (a reply the model may carry on), the between-attention graphs that run those
        lengths, so the second a reply first passes its prepared room pays no capture (on the H200, capturing them
        there made that second's THINK 130 ms against ~92 for its neighbours)."""
        self._follow(kv)
        for n in range(2, min(int(up_to), kv.capacity) + 1):
            self.capture(kv, n, warm=True)
        if isinstance(kv, DemandKV) and kv.capacity > int(up_to):
            self.layered = LayerGraphs(self.tts, kv, self.device, capture=True, head=self.tts.head_code[0])
        torch.cuda.synchronize(self.device)
        kv.k_buf.zero_()
        kv.v_buf.zero_()
        kv.reset()

    def ahead(self, kv, span: int, stop: Optional[Callable[[], bool]] = None) -> int:
        """Between seconds, in a reply longer than the prepared room: the per-length graphs of the next
        ``span`` lengths past the history (a second adds at most the declared worst case), so the next
        second's steps replay one graph each instead of the between-attention graphs. Lengths the history
        has passed are dropped (a later turn reaching them captures them again). ``stop`` (asked before each
        capture): the next second is here, the rest waits. Returns how many were made.

        Each new graph is launched once here, writing only past the history (where the real step writes again
        before anything reads): a graph's first launch uploads it to the device, and each of these replays
        once in the second itself, so that cost stays out of the second (on the H200, graphs prepared ahead
        without it made the second no faster)."""
        self._follow(kv)
        room = self.recurring or 0
        for n in [n for n in self.graphs if room < n <= kv.length]:
            del self.graphs[n]
        if kv.length == 0 or kv.kind != "demand":        # a new turn starts inside the prepared room
            return 0
        made = 0
        with kv.rehearsal():                          # the next second's lengths, past this second's bounds
            for n in range(max(kv.length + 1, room + 1), min(kv.length + int(span), kv.capacity) + 1):
                if n in self.graphs:
                    continue
                if stop is not None and stop():
                    break
                self.capture(kv, n, warm=False)       # its kernels first ran in the start-up captures
                self.graphs[n][0].replay()            # its upload, here rather than in the second
                made += 1
        return made

    def _layered(self, code: torch.Tensor, kv) -> torch.Tensor:
        """A step at a length without its own graph — past the reply's room (a history carried over cut
        replies), or any length after the store moved (which dropped the per-length graphs): graphs
        between the attention calls (:class:`~.llm_graphs.LayerGraphs`, as the LLM's), valid at every
        length, with exact-length eager attention; captured once per store allocation (~21 graphs), so
        no length pays an eager step plus a capture (H200: 311 ms THINK past the room, like the
        per-length graphs; lazily recapturing every length after a move cost 0.9-1.1 s seconds)."""
        n = kv.length + 1
        if n > kv.capacity:
            kv._room(n)                                       # one move: new storage, new graphs
        if self.layered is None or not self.layered.valid_for(kv):
            self.layered = LayerGraphs(self.tts, kv, self.device, capture=self.device.type == "cuda",
                                       head=self.tts.head_code[0])
        _, logits = self.layered.forward(self.tts.emb_code[0](code))
        self.replays += 1
        return logits

    def step(self, code: torch.Tensor, kv) -> torch.Tensor:
        self._follow(kv)
        n = kv.length + 1
        entry = self.graphs.get(n)
        if entry is None and isinstance(kv, DemandKV):
            return self._layered(code, kv)
        if entry is None:
            logits = self.tts.step_code(code, kv)             # eager, for real; capture for next time
            self._follow(kv)                                  # (this step may have grown the store)
            if self.recurring is None or n <= self.recurring:
                kv.length -= 1
                self.capture(kv, n, warm=False)
                kv.length += 1
            return logits
        g, static_code, out = entry
        static_code.copy_(code)
        self.runtime.replay(g)
        kv.commit(1)
        self.replays += 1
        return out.clone()


class PrefillGraphs:
    """The second's condition prefill through layer graphs of its width, captured ahead of time.

    A speaking second first feeds its condition — one row per text token plus the audio BOS, so 1 .. ``widest``
    rows — at the turn's current length. Eagerly that is ~50 kernels a layer launched one by one. Here each
    width has its :class:`~.llm_graphs.LayerGraphs` over the turn's store (valid at every length: attention runs
    eagerly at the exact length between the graphs, as in the decode steps). Every width is captured when the
    session starts, so no second pays a capture. The code head runs over every row and keeps the last one, as
    the eager forward does: inside the last graph for one row, eagerly after it for more.

    All widths share one pool. That is safe because their forwards never interleave, and each forward reads
    only its own graphs' outputs and copies its result out before any other width replays. A width missing, or
    graphs left behind by a store that moved, return None and the caller runs the eager forward;
    :meth:`capture` makes them again."""

    def __init__(self, tts: TTS, device: torch.device, widest: int):
        self.tts, self.device, self.widest = tts, torch.device(device), int(widest)
        self.runtime = GraphRuntime(self.device, "tts prefill graphs")
        self.by_width: Dict[int, LayerGraphs] = {}
        self.replays = 0

    def capture(self, kv, widths: Optional[int] = None) -> int:
        """Graphs over ``kv``'s storage as it is now: of every width 1 .. widest (``widths`` None, at start), or
        of at most ``widths`` of the widths still missing (a second with time to spare makes a few; the rest
        run eagerly until later seconds make them). Graphs over other storage are dropped first. The warm-ups
        write past the history, where the real prefill writes again before anything reads. Returns how many
        widths were captured."""
        if kv.length + self.widest > kv.capacity:
            raise RuntimeError("the TTS store has no room past its history for the prefill graphs' warm-ups")
        if any(not g.valid_for(kv) for g in self.by_width.values()):
            self.by_width = {}
            self.runtime.drop_pool()             # the old graphs are gone with their pool
        missing = [t for t in range(1, self.widest + 1) if t not in self.by_width]
        missing = missing if widths is None else missing[:max(0, int(widths))]
        head = self.tts.head_code[0]
        on_cuda = self.device.type == "cuda"
        with kv.rehearsal():
            for t in missing:
                self.by_width[t] = LayerGraphs(self.tts, kv, self.device, capture=on_cuda, head=head, tokens=t,
                                               runtime=self.runtime)
        return len(missing)

    def valid_for(self, kv) -> bool:
        """Whether every width has its graphs, writing into ``kv``'s current storage."""
        return len(self.by_width) == self.widest and all(g.valid_for(kv) for g in self.by_width.values())

    def run(self, cond: torch.Tensor, kv) -> Optional[torch.Tensor]:
        """The prefill of ``cond`` [T, hidden] -> float32 logits [1, codes] of its last row (the eager
        forward's bits), or None: no graphs for this width or this storage."""
        t = int(cond.shape[0])
        graphs = self.by_width.get(t)
        if graphs is None or not graphs.valid_for(kv) or kv.length + t > kv.capacity:
            return None
        h, logits = graphs.forward(cond)
        self.replays += 1
        if logits is None:                                       # several rows: the head over all of them
            logits = self.tts.head_code[0](h.unsqueeze(0))[:, -1].float()
        return logits

