"""The MiniCPM-o 4.5 duplex unit: what happens to the LLM and the TTS in one second.

LISTEN (:meth:`Protocol.prefill`): the previous unit is closed first (its deferred terminator and
``</unit>`` fed as the stock's deferred finalize does), then ``<unit>`` and the second's 10 audio
embeddings are fed; the logits of the last position wait for THINK.

THINK (:meth:`Protocol.decode`): at most 20 decode steps. Step 0 is the decision token (sampled, or
forced by the turn policy); a sampled ``<|listen|>`` while a reply is still open becomes
``<|tts_bos|>``; ``<|listen|>``, ``<|chunk_eos|>`` and ``<|chunk_tts_eos|>`` end the unit (deferred to
the next finalize); step 19 is always ``<|chunk_eos|>``; every other token is fed back, and from step 1
on its token id and final hidden state go to the TTS. ``<|turn_eos|>`` ends the reply: the TTS may
stop early and its per-turn history is dropped after this second. A reply cut by a barge-in is closed
with ``<|turn_eos|>`` before the unit; as in the stock loop, the TTS's history survives the cut (the
next reply's first second is then not a turn start for the TTS). A listening unit runs no TTS.

The TTS (:meth:`Protocol.speak`) prefills the condition and draws 26 codes (25 kept; fewer when it
draws EOS where EOS is allowed: at a reply's first and last second). Where EOS is allowed the stock looks at
every code as it is drawn and stops at EOS; reading each code back would make the host wait for the GPU 26
times. Over a demand store the 26 steps run ahead without looking, the codes are read once, and a run past an
EOS is taken back: the store's length and the generator's state go back to where they were right after the
EOS was drawn (the rows written past it lie beyond the history, where the next writes land first), and the
stage taps see only the steps the stock ran.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import torch

from engine.core import yieldpoints
from engine.finite import check_logits

from .dims import Dims
from .kv import KVStore
from .llm import Qwen3
from .sampling import code_logits, draw, draw_state, set_draw_state, text_sampler
from .tts import TTS
from .turns import TurnDecision

#: the widest feed replayed through layer graphs of its width (a second's close + audio tokens are 2 and 10;
#: the prelude's hundreds run eagerly, once)
GRAPHED_FEED = 16


@dataclass
class Unit:
    """What THINK made of one second."""

    decision: str                          # "listen" | "speak"
    text_ids: List[int] = field(default_factory=list)    # tokens after the decision token (to the TTS)
    llm_steps: int = 0                     # decode steps run
    end_of_turn: bool = False
    cut: bool = False                      # a reply still open was closed at the start (barge-in)
    codes: Optional[torch.Tensor] = None   # [n] int64 on the device (speaking units)
    ids: List[int] = field(default_factory=list)         # every token the unit's slots chose, in order


class Protocol:
    """The per-second duplex protocol over an LLM KV store and a per-turn TTS KV store.

    ``kv_llm`` / ``kv_tts`` are attributes the backbone swaps when the demand toggle flips;
    ``tts_step`` runs one TTS decode step (eager or a replayed graph); ``graphed_forward`` (optional) runs
    the LLM forward of 1 .. ``GRAPHED_FEED`` embedding rows [t, hidden] (a decode step's one token, or a short
    feed: LISTEN's close and audio tokens) through layer graphs of width t -> (final hidden [t, hidden],
    logits [1, V] for t = 1, else None), or returns None to leave it to the eager path; ``too_long``
    (optional, with a tokenizer) says whether a unit's text has reached the stock's 28-character limit;
    ``tts_prefill`` (optional) runs the TTS's condition prefill (rows [T, hidden]) through graphs -> the logits
    [1, codes] of its last row, or None to leave it to the eager forward.
    """

    def __init__(self, dims: Dims, llm: Qwen3, tts: TTS, kv_llm: KVStore, kv_tts: KVStore,
                 tts_step: Callable[[torch.Tensor, KVStore], torch.Tensor],
                 too_long: Optional[Callable[[List[int]], bool]] = None,
                 graphed_forward: Optional[Callable[[torch.Tensor], Optional[tuple]]] = None,
                 bad_token_ids: Sequence[int] = (),
                 tts_prefill: Optional[Callable[[torch.Tensor, KVStore], Optional[torch.Tensor]]] = None):
        self.d = dims
        self.llm, self.tts = llm, tts
        self.kv_llm, self.kv_tts = kv_llm, kv_tts
        self.tts_step = tts_step
        self.too_long = too_long
        self.graphed_forward = graphed_forward
        self.tts_prefill = tts_prefill
        self.sampler = text_sampler(dims.sampling, dims.tokens, bad_token_ids)
        self.turn_ended = True
        self.pending_close: Optional[List[int]] = None
        self.logits: Optional[torch.Tensor] = None
        self.tap: Optional[Callable[[str, torch.Tensor], None]] = None    # the bench's per-stage digests

    def _emit(self, stage: str, t: torch.Tensor) -> None:
        if self.tap is not None:
            self.tap(stage, t)

    # -- LISTEN ----------------------------------------------------------------------------------------
    def feed(self, embeds: torch.Tensor) -> torch.Tensor:
        """Feed embeddings [T, hidden]; the final hidden state of each position [T, hidden]. A short feed
        (2 .. GRAPHED_FEED positions: LISTEN's close and audio tokens) goes to ``graphed_forward``'s layer
        graphs of that width where the backbone has them (the same kernels; None: eager)."""
        if self.graphed_forward is not None and 1 < embeds.shape[0] <= GRAPHED_FEED:
            out = self.graphed_forward(embeds)
            if out is not None:
                return out[0]
        return self.llm(embeds, self.kv_llm)

    def step_ids(self, ids: List[int], logits: bool) -> tuple:
        """Feed token ids; (final hidden [T, hidden], last logits [1, V] or None when not asked for)."""
        emb = self.llm.embed(ids)
        if len(ids) == 1 and self.graphed_forward is not None:
            out = self.graphed_forward(emb)
            if out is not None:
                return out
        h = self.feed(emb)
        return h, (self.llm.logits(h) if logits else None)

    def prepare(self, prefix_ids: List[int], reference: Optional[torch.Tensor], suffix_ids: List[int]) -> None:
        """The session's prelude before its first second, as the stock's ``prepare`` feeds it: the system
        prompt's prefix ids, the reference audio's embeddings [T, hidden] (when given), the suffix ids; one
        forward each, no logits, no draws."""
        for ids in (prefix_ids, None, suffix_ids):
            if ids is None:
                if reference is not None:
                    self.feed(reference.to(self.llm.lm_head.weight.dtype))
            elif ids:
                self.feed(self.llm.embed(ids))

    def close_unit(self) -> None:
        """The deferred finalize of the previous unit: its terminator (if any) and ``</unit>``."""
        if self.pending_close is not None:
            self.step_ids(self.pending_close, logits=False)
            self.pending_close = None

    def prefill(self, audio_emb: torch.Tensor) -> None:
        """``<unit>`` then the second's audio embeddings [10, hidden]; keep the last logits."""
        self.close_unit()
        self.step_ids([self.d.tokens.unit], logits=False)
        h = self.feed(audio_emb.to(self.llm.lm_head.weight.dtype))
        self.logits = self.llm.logits(h)
        self._emit("llm_logits", self.logits)

    # -- THINK ------------------------------------------------------------------------------------------
    #
    # The unit's rules, as MiniCPM-o's duplex loop applies them:
    # * a second forced to listen while a reply is open first closes the reply: <|turn_eos|> is fed (its
    #   logits replace the prefill's) and the unit counts as a cut;
    # * the unit has at most ``max_tokens_per_unit`` slots; the last one is never drawn: it holds the
    #   deferred <|chunk_eos|>;
    # * a slot's token is the policy's (the decision slot 0, or <|turn_eos|> in the second-to-last slot of a
    #   reply's last second) or the sampler's, a sampled <|listen|> while the reply is open read as
    #   <|tts_bos|>;
    # * a terminator (<|listen|>, <|chunk_eos|>, <|chunk_tts_eos|>) ends the unit unfed (deferred with
    #   </unit> to the next LISTEN); <|listen|> makes it a listening unit;
    # * any other token keeps the reply open; after slot 0, one that would bring the unit's text to the
    #   character limit is dropped and the unit ends with <|chunk_eos|>;
    # * otherwise it is fed (its logits drive the next slot); the unit ends its turn exactly when the last
    #   token fed is <|turn_eos|>, which also closes the reply; after slot 0 the token and its hidden state
    #   are the unit's text for the TTS.

    def decode(self, turn: TurnDecision) -> tuple:
        """Run the unit's slots; returns (Unit, hidden states [n, hidden] of its text tokens or None)."""
        logits, self.logits = self.logits, None
        check_logits(logits, "the LLM's decision logits")          # once a second, before the first draw
        unit = Unit("speak")
        if turn.forced == "listen" and not self.turn_ended:
            logits = self._close_reply()
            unit.cut = True
        hidden: List[torch.Tensor] = []
        ender = self.d.tokens.chunk_eos
        for slot in range(self.d.sampling.max_tokens_per_unit - 1):
            tok = self._choose(slot, turn, logits)
            unit.ids.append(tok)
            unit.llm_steps += 1
            if tok in self.d.tokens.chunk_terminators:
                ender = tok
                unit.decision = "listen" if tok == self.d.tokens.listen else "speak"
                break
            self.turn_ended = False
            if slot > 0 and self.too_long is not None and self.too_long(unit.text_ids + [tok]):
                break
            h, logits = self._feed_one(tok)
            unit.end_of_turn = self.turn_ended = tok == self.d.tokens.turn_eos
            if slot > 0:
                unit.text_ids.append(tok)
                hidden.append(h[-1:])
        self.pending_close = [ender, self.d.tokens.unit_end]
        return unit, (torch.cat(hidden, dim=0) if hidden else None)

    def _close_reply(self) -> torch.Tensor:
        """Feed <|turn_eos|> to close a reply a barge-in cut; its logits. The token2wav tail starts afresh (the
        session's part); the TTS keeps its history (only a reply's own turn end drops it), as in the stock."""
        _, logits = self._feed_one(self.d.tokens.turn_eos)
        self.turn_ended = True
        return logits

    def _feed_one(self, tok: int) -> tuple:
        h, logits = self.step_ids([tok], logits=True)
        self._emit("llm_logits", logits)
        return h, logits

    def _choose(self, slot: int, turn: TurnDecision, logits: torch.Tensor) -> int:
        tk = self.d.tokens
        if slot == 0 and turn.forced is not None:
            return tk.listen if turn.forced == "listen" else tk.speak
        if turn.last and slot == self.d.sampling.max_tokens_per_unit - 2:
            return tk.turn_eos
        tok = self.sampler(logits)
        return tk.tts_bos if tok == tk.listen and not self.turn_ended else tok

    # -- the TTS ----------------------------------------------------------------------------------------
    def speak(self, unit: Unit, hidden: Optional[torch.Tensor]) -> None:
        """Draw the second's codes into ``unit.codes``; drop the TTS history after a reply's last second."""
        s, d = self.d.sampling, self.d.tts
        kv = self.kv_tts
        min_codes = 0 if (kv.length == 0 or unit.end_of_turn) else s.tts_steps
        cond = self.tts.condition(unit.text_ids, hidden)                       # [n + 1, hidden]
        logits = self.tts_prefill(cond, kv) if self.tts_prefill is not None else None
        if logits is None:
            logits = self.tts(cond, kv)
        codes = torch.zeros(s.tts_steps, dtype=torch.long, device=cond.device)
        if min_codes < s.tts_steps and kv.kind == "demand":
            kept = self._codes_ahead(logits, codes, min_codes)
        else:
            kept = self._codes_checked(logits, codes, min_codes)
        unit.codes = codes[:kept]
        self._emit("codes", unit.codes)
        if unit.end_of_turn:
            self.end_turn()

    def _step_code(self, logits: torch.Tensor, codes: torch.Tensor, t: int, min_codes: int) -> torch.Tensor:
        """Step ``t``'s draw into ``codes[t]``; the next step's logits are the caller's."""
        s, d = self.d.sampling, self.d.tts
        c = draw(code_logits(logits, codes, t, s, d.eos, min_codes))
        codes[t:t + 1] = c
        return c

    def _codes_checked(self, logits: torch.Tensor, codes: torch.Tensor, min_codes: int) -> int:
        """The stock's loop: each code read back where EOS may come, stopping at it; how many codes are kept."""
        steps, eos = self.d.sampling.tts_steps, self.d.tts.eos
        for t in range(steps):
            if t > 0:
                logits = self.tts_step(codes[t - 1:t], self.kv_tts)
            self._emit("tts_logits", logits)
            c = self._step_code(logits, codes, t, min_codes)
            if t >= min_codes:                               # a host check only where EOS may come
                yieldpoints.wait()
                if int(c.item()) == eos:
                    return t
        return steps - 1

    def _codes_ahead(self, logits: torch.Tensor, codes: torch.Tensor, min_codes: int) -> int:
        """Every step run without reading a code back, then one read: where an EOS came at or after
        ``min_codes``, the store's length and the generator go back to right after it was drawn, and only the
        steps up to it reach the taps (as :meth:`_codes_checked` would have run them)."""
        steps, eos, kv = self.d.sampling.tts_steps, self.d.tts.eos, self.kv_tts
        start, dev = kv.length, codes.device
        seen: List[torch.Tensor] = []
        after: List[torch.Tensor] = []                          # the generator's state after each draw
        for t in range(steps):
            if t > 0:
                logits = self.tts_step(codes[t - 1:t], kv)
            if self.tap is not None:
                seen.append(logits)
            self._step_code(logits, codes, t, min_codes)
            after.append(draw_state(dev))
        yieldpoints.wait()                                      # under a scheduler: park until the codes are in
        drawn = codes.tolist()
        kept = next((t for t in range(min_codes, steps) if drawn[t] == eos), steps - 1)
        if kept < steps - 1:                                    # the stock stopped at step ``kept``
            kv.length = start + kept
            set_draw_state(dev, after[kept])
        for x in seen[:kept + 1]:
            self._emit("tts_logits", x)
        return kept

    def end_turn(self) -> None:
        """The TTS's turn ends: its history goes. The LLM's reply state is the unit's own: a token drawn
        after ``<|turn_eos|>`` and dropped at the character limit has reopened it (as in the stock loop),
        so a Force Listen next second closes it again with ``<|turn_eos|>``."""
        self.kv_tts.reset()
