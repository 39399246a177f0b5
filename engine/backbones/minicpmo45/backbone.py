"""Backbone ``minicpm-o-4.5``: MiniCPM-o 4.5's whole duplex second in front of the Step-Audio2 tail.

LISTEN = audio encoder (an engine model on the executor) + the LLM prefill of ``<unit>`` and 10 audio
tokens; THINK = the LLM's decode steps + the TTS's 26 steps; SPEAK = token2wav (the session's tail).
A listening second runs neither the TTS nor token2wav (its registry entry's ``listen_skips_tail``): the session plays
silence. Speaking seconds hand the tail their 25 codes, every reply's first second behind 3 silence
tokens (4218). Turns end as in the stock duplex loop (``_reset_token2wav_for_new_turn``): a reply's
last second says ``turn_end="end"`` (the tail decodes what it holds as the turn's last chunk, then goes
back to its state after the voice prompt), a reply cut by a barge-in says ``turn_end="cut"`` (the same
reset; the codes it held are dropped), so each reply's token2wav buffer starts with the 3 silences.

Before the first second a checkpoint folder's session feeds its prelude as the stock's ``prepare`` does
(prompt.py): the system prompt (``system_prompt``, default the demo's default duplex preset) wrapped around
the reference audio's embeddings (ref_audio.py: the whole clip through the encoder under a chunk mask). The
clip is ``reference_audio`` when it names an audio file (the session's ``--voice`` WAV), else the folder's
``assets/HT_ref_audio.wav`` (a ``.npz`` voice is token2wav's prompt and holds no audio), else none.

Modes (the engine toggles): *stock* (demand_sized off) keeps every history as MiniCPM-o's PyTorch
runtime does — HF-style caches grown with ``torch.cat``, all eager; *demand* allocates every region
once at the planner's demand; *graphs* adds exact-shape CUDA graph replay where shapes recur: the
encoder's second (one graph per signature of its 29-second cycle), the TTS decode steps (one per
per-turn KV length in a reply's prepared room; past it, graphs between the attention calls) and the TTS's
condition prefill (layer graphs of each width a unit can make, tts.PrefillGraphs). The LLM's
forwards replay graphs between its attention calls (llm_graphs.py), attention eager at the exact length: its
length grows every token, and a padded cache with a mask would change the bits (one-query attention reads the
grouped key/value heads as they are where the start-up check proved it: gqa.py). Before the first second a
CUDA session rehearses one second's eager paths on scratch (rehearse.py) and the CPU log-mel's first calls
run on throwaway front ends, so the first seconds pay no first launches. In the time between seconds
(:meth:`MiniCPMO45Backbone.prepare_ahead`; the session's ``ahead``, the bench's ``--ahead``) the TTS steps of a
reply past its prepared room get their per-length graphs (the default), and optionally the next second's LLM
forwards are captured whole at their exact positions (exact_graphs.py). Every mode gives the same tokens, codes
and audio.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Optional

import torch

from engine import fastpath
from engine.core import Executor, make_plan
from engine.core.graphs import between_captures
from engine.core import yieldpoints
from engine.core.toggles import PendingToggles, Toggles
from engine.kernels import exact

from ..base import Backbone, BackboneInfo, Thought, TokenFormat
from .batched_llm import LLM_STEP, LLMStepBatch
from .audio import AudioEncoder, FrontEnd, check_one_thread, warm_front_end
from . import gqa
from .dims import Dims, preset
from .exact_graphs import ExactForwards, next_forwards
from .kv import DemandKV, demand_units, kv_regions, make_store, switch_store
from .layers import apply_rope_stock, inverse_frequencies, pin_attention_kernels, rms_norm_stock, seeded_init
from .llm import Qwen3
from .llm_graphs import LayerGraphs, make_layer_graphs
from .prompt import DEFAULT_SYSTEM_PROMPT, prelude
from .protocol import GRAPHED_FEED, Protocol
from .ref_audio import choose_clip, reference_embeddings
from .rehearse import can_rehearse, rehearse
from .tts import TTS, DecodeGraphs, PrefillGraphs
from .turns import TurnDecision, make_turns
from . import weights as W

if TYPE_CHECKING:
    from engine.vad import VadResult

SILENCE = 4218                 # the Step-Audio2 silence token
LOOKAHEAD = 3
LLM_TOKENS_PER_SECOND = 33     # worst case: finalize 2 + <unit> 1 + audio 10 + turn_eos 1 + 19 decoded
TTS_TOKENS_PER_SECOND = 45     # worst case: 19 text + audio BOS + 25 codes fed back
#: the LLM store grows ahead, in a second after a listening one (time to spare for the captures), once its room
#: would not hold this many more worst-case seconds; past it, a second that must have room grows then
GROW_AHEAD_SECONDS = 10
#: a reply's first seconds whose TTS decode steps get their own graphs at start when no turn policy bounds a
#: reply (the model decides: a real checkpoint); the voice-activity policy prepares its whole reply room
PREPARED_REPLY_SECONDS = 4
#: prefill widths (21 graphs each) captured again in one second after a listening one, once the TTS store moved
PREFILL_WIDTHS_PER_SECOND = 4
#: what :meth:`MiniCPMO45Backbone.prepare_ahead` may capture between seconds
AHEAD_SCOPES = ("tts", "listen", "all")


class MiniCPMO45Backbone(Backbone):
    """MiniCPM-o 4.5 (audio encoder, Qwen3 LLM, TTS) on released or seeded random weights."""

    @staticmethod
    def model_dtype(device: torch.device) -> torch.dtype:
        """The models' dtype on ``device``: bfloat16 on CUDA (as the demo casts the model), float32 elsewhere."""
        return torch.bfloat16 if device.type == "cuda" else torch.float32

    def __init__(self, fmt: TokenFormat, *, size: str, device, seed: int = 0, checkpoint: Optional[str] = None,
                 demand_sized: bool = True, graph_replay: bool = True, reply_seconds: int = 4,
                 debug: bool = False, turn_policy: Optional[str] = None, horizon_seconds: int = 60,
                 shared: Optional[Dict[str, object]] = None, system_prompt: Optional[str] = None,
                 reference_audio: Optional[str] = None):
        if fmt.codebooks != 1 or fmt.vocab != 6561:
            raise ValueError("the minicpm-o-4.5 backbone speaks Step-Audio2 tokens: use it with the 'step-audio2' tail")
        self.fmt, self.size, self.seed = fmt, size, int(seed)
        self.device = torch.device(device)
        self.folder = W.open_folder(checkpoint) if checkpoint else None
        self.dims: Dims = self.folder.dims if self.folder else preset(size)
        self.turns = make_turns(turn_policy or ("model" if self.folder else "voice-activity"), reply_seconds)
        self.horizon_seconds = int(horizon_seconds)
        self._toggles = Toggles(bool(demand_sized), bool(graph_replay))
        self._pending = PendingToggles(self._toggles)         # applied at the next LISTEN
        self.debug = debug
        self._shared = shared
        self._fused: List[fastpath.Verdict] = []        # the start-up self-checks' verdicts (on CUDA)
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else str(system_prompt)
        self.reference_clip = choose_clip(self.folder.path if self.folder else None, reference_audio)
        self.dtype = self.model_dtype(self.device)
        self.tts_graphs: Optional[DecodeGraphs] = None
        self.tts_prefill: Optional[PrefillGraphs] = None
        self.rehearsed: Optional[str] = None      # what ran on scratch before the first second (CUDA)
        # the session's stage clock: think() marks where its TTS starts ("tts"), so a record splits THINK
        self.stage_mark: Optional[Callable[[str], None]] = None
        self._in_reply = False
        self._speech = False
        self._listened = False                  # the last second's unit listened (THINK's decision)
        self.grown_ahead = 0                    # LLM store moves made ahead (in a second after a listening one)
        self._force_listen = False            # the next THINK listens (the page's Force Listen)
        self._tap: Optional[Callable[[str, torch.Tensor], None]] = None
        l, t = self.dims.llm, self.dims.tts
        weights = f"checkpoint {self.folder.path}" if self.folder else "seeded random weights"
        self.info = BackboneInfo(
            name="minicpm-o-4.5",
            title=(f"MiniCPM-o 4.5 (Whisper {self.dims.audio.d_model}x{self.dims.audio.layers} -> Qwen3 "
                   f"{l.hidden}x{l.layers} -> TTS {t.hidden}x{t.layers}; {size}; {weights}; "
                   f"turns: {self.turns.label})"),
            synthetic=self.folder is None,
            note=("" if self.folder else "seeded random weights and the voice-activity turn policy: timing and "
                  "memory are real, the words and the voice are not"))

    # -- building --------------------------------------------------------------------------------------
    def start(self) -> None:
        d, dev, dt = self.dims, self.device, self.dtype
        pin_attention_kernels(dev)              # before any capture: cuDNN attention does not repeat its bits
        self._fused = self._check_fused_kernels()   # likewise before any capture (the check captures too)
        with torch.no_grad():
            if self._shared is not None:        # another session's modules: read only, every state is ours
                self.llm, self.tts, self.encoder = (self._shared[k] for k in ("llm", "tts", "encoder"))
            else:
                self.llm = W.build(Qwen3, d.llm, device=dev, dtype=dt).eval()
                self.tts = W.build(TTS, d.tts, d.llm, device=dev, dtype=dt).eval()
                self.encoder = W.build(AudioEncoder, d.audio, d.llm.hidden, device=dev, dtype=dt).eval()
                self.encoder.float_buffers(dev)
                self._fill_weights()
            here = torch.empty(0, device=dev).device     # indexed, as a tensor's .device is
            for dd in (d.llm, d.tts):                     # RoPE frequencies made before any capture
                inverse_frequencies(int(dd.head_dim), float(dd.rope_theta), dt, here)
            spec = self.encoder.session_spec()
            self.executor = Executor(self.encoder, make_plan(self.encoder.regions(spec), spec), dev,
                                     debug=self.debug, **self._toggles)
            self.executor.prepare_graphs(lambda sp: self.encoder.example_inputs(sp, dev))
            between_captures()                  # each phase's end: a running session waiting to capture goes first
            self.executor.init_state({})
            self.front = FrontEnd(self.encoder.fbank, self.encoder.window, dev, self._toggles.demand_sized)
            warm_front_end(self.encoder.fbank, self.encoder.window, dev)     # the CPU mel's first calls, off the clock
            if dev.type == "cuda":                 # the CPU's threads sleep between seconds: one, where proven
                one = check_one_thread(self.encoder.fbank, self.encoder.window)
                self.front.threads = 1 if one.chosen else None
                self._fused.append(one)
            self._make_stores()
            between_captures()
            self._prepare_tts_graphs()
            self._capture_llm_graphs()
            between_captures()
            tok = self.folder.tokenizer if self.folder else None
            too_long = None
            if tok is not None:
                limit = d.sampling.max_chars_per_unit
                too_long = lambda ids: len(tok.decode(ids, skip_special_tokens=True)) >= limit   # noqa: E731
            self.protocol = Protocol(d, self.llm, self.tts, self.kv_llm, self.kv_tts, self._tts_step, too_long,
                                     self._graphed_forward, self.folder.bad_token_ids if self.folder else (),
                                     self._tts_prefill)
            self.protocol.tap = self._tap
            if tok is not None:                 # the stock's prepare: the system prompt around the reference audio
                clip = self.reference_clip
                pre = prelude(tok, self.system_prompt, reference_embeddings(self.encoder, clip) if clip else None)
                between_captures()
                self.protocol.prepare(pre.prefix_ids, pre.reference, pre.suffix_ids)
            if self.can_join_group():          # under a device's scheduler: its batched step's checks, once
                yieldpoints.prepare(LLM_STEP, self.llm, self)
            between_captures()
            self.rehearsed = self._rehearse()
            between_captures()

    def _rehearse(self) -> Optional[str]:
        """On CUDA, over demand stores: one listening and one speaking second's eager paths once on scratch, state
        put back (rehearse.py), so the first real seconds do not pay the kernels' first launches. A backbone built
        around another session's weights skips it: that session's seconds launched every kernel in this process
        already."""
        if self._shared is not None:
            return None
        if self.device.type != "cuda" or not can_rehearse(self.protocol, LLM_TOKENS_PER_SECOND, TTS_TOKENS_PER_SECOND):
            return None
        return rehearse(self.protocol, self.audio_tokens(), self.device)

    def _check_fused_kernels(self) -> List[fastpath.Verdict]:
        """Whether the captured graphs take the exact fused RMSNorm/RoPE (:mod:`engine.kernels.exact`): checked
        against the stock chains at this model's norm widths and head layouts, one position and a LISTEN feed's;
        and whether the replayed forward's one-query attention skips widening its grouped heads (:mod:`.gqa`)
        (on CUDA only: the CPU captures nothing)."""
        if self.device.type != "cuda":
            return []
        l, t = self.dims.llm, self.dims.tts
        norms, ropes, both = [], [], []
        for w in (1, 11):
            heads = [((1, w, l.heads, l.head_dim), l.eps), ((1, w, l.kv_heads, l.head_dim), l.eps)]
            norms += [((1, w, l.hidden), l.eps), ((1, w, t.hidden), t.eps)] + heads
            ropes += [(l.heads, w, l.head_dim), (l.kv_heads, w, l.head_dim), (t.heads, w, t.head_dim)]
            both += heads                                  # Qwen3's q/k norm, then RoPE, in one pass
        return [exact.prepare(self.device, (l, t), norms, ropes, rms_norm_stock, apply_rope_stock, both),
                gqa.prepare(self.device, l.heads, l.kv_heads, l.head_dim, self.dtype)]

    def fast_paths(self) -> List[fastpath.Verdict]:
        """The start-up self-check's verdicts on the backbone's faster paths (the session info shows them)."""
        return list(self._fused)

    def _fill_weights(self) -> None:
        if self.folder is None:
            seeded_init(self.llm, self.seed * 1000 + 1)
            seeded_init(self.tts, self.seed * 1000 + 2)
            seeded_init(self.encoder, self.seed * 1000 + 3)
            return
        sh = W._Shards(self.folder, "cpu")
        W.load_module(self.llm, sh, "llm.")
        W.load_module(self.tts, sh, "tts.")
        names = [n for n, _ in self.encoder.named_parameters()]
        rename = {n: ("audio_projection_layer." + n[5:]) if n.startswith("proj.") else "apm." + n for n in names}
        W.load_module(self.encoder, sh, "", rename)

    def _make_stores(self) -> None:
        d, dt = self.dims, self.dtype
        self.llm_regions = kv_regions("llm", d.llm.layers, d.llm.kv_heads, d.llm.head_dim, LLM_TOKENS_PER_SECOND,
                                      d.llm.max_positions, dt, "HF DynamicCache: torch.cat per forward, unbounded")
        seconds = min(self.horizon_seconds, d.llm.max_positions // LLM_TOKENS_PER_SECOND)
        self.llm_capacity = demand_units(self.llm_regions, seconds)
        per_turn = self.turns.max_turn_seconds
        tts_cap = d.tts.max_positions if per_turn is None else min(d.tts.max_positions,
                                                                   per_turn * TTS_TOKENS_PER_SECOND)
        self.tts_regions = kv_regions("tts", d.tts.layers, d.tts.kv_heads, d.tts.head_dim, TTS_TOKENS_PER_SECOND,
                                      d.tts.max_positions, dt, "HF DynamicCache per turn: torch.cat per token")
        self.tts_capacity = tts_cap
        demand = self._toggles.demand_sized
        # with a sink: one position past the room where a batched step writes this session's row while it sits
        # the step out (batched_llm.py); no history reaches it, no attention reads it
        self.kv_llm = make_store(demand, self.llm_regions[0], d.llm.layers, self.llm_capacity, self.device,
                                 growable=True, sink=True)
        # a reply's turn bounds the TTS history, except over barge-ins (the stock keeps it across a cut):
        # then the store doubles, up to the TTS's positions, and its graphs are captured again
        self.kv_tts = make_store(demand, self.tts_regions[0], d.tts.layers, self.tts_capacity, self.device,
                                 growable=True)

    def _graphs_on(self) -> bool:
        return self._toggles.effective(self.device).graph_replay

    def tts_prepared_length(self) -> int:
        """The TTS KV lengths whose decode step gets its own graph at start (2 .. this): a reply's whole room
        under a turn policy that bounds it; else (the model decides) its first PREPARED_REPLY_SECONDS seconds
        at the declared worst case — a longer reply's later steps replay the between-attention graphs."""
        if self.turns.max_turn_seconds is not None:
            return self.tts_capacity
        return min(self.tts_capacity, PREPARED_REPLY_SECONDS * TTS_TOKENS_PER_SECOND)

    def _prepare_tts_graphs(self) -> None:
        if not self._graphs_on():
            return
        prepared = self.tts_prepared_length()
        self.tts_graphs = DecodeGraphs(self.tts, self.device, prepared)
        self.tts_prefill = PrefillGraphs(self.tts, self.device, self.prefill_widest())
        if self.kv_tts.length == 0:
            rng = torch.cuda.get_rng_state(self.device)
            self.tts_graphs.prepare(self.kv_tts, prepared)
            self._capture_prefill()
            torch.cuda.set_rng_state(rng, self.device)

    def prefill_widest(self) -> int:
        """The widest condition a second can make: one row per text token (every drawn slot but the decision
        one: the unit's last slot is never drawn) plus the audio BOS."""
        return self.dims.sampling.max_tokens_per_unit - 1

    def _capture_prefill(self, widths: Optional[int] = None) -> int:
        """The TTS prefill's graphs over the TTS store as it is now (a demand store with room for the widest
        condition past its history): every width, or ``widths`` of those missing; none otherwise, and the eager
        forward runs the prefill. Returns the widths captured."""
        kv, pf = self.kv_tts, self.tts_prefill
        if pf is None or not isinstance(kv, DemandKV) or kv.length + pf.widest > kv.capacity:
            return 0
        return pf.capture(kv, widths)

    def _refresh_prefill(self) -> None:
        """In a second after a listening one (time to spare): a few of the prefill's widths again
        (PREFILL_WIDTHS_PER_SECOND), when the TTS store they were captured over moved or was switched by the
        toggles; the widths not yet made run eagerly."""
        pf = self.tts_prefill
        if pf is not None and self._listened and self.device.type == "cuda" and not pf.valid_for(self.kv_tts):
            self._capture_prefill(PREFILL_WIDTHS_PER_SECOND)

    def _tts_prefill(self, cond: torch.Tensor, kv) -> Optional[torch.Tensor]:
        if self.tts_prefill is None or not self._graphs_on():
            return None
        return self.tts_prefill.run(cond, kv)

    def feed_widths(self) -> List[int]:
        """The short LLM feeds every second makes, by the declared clocks: LISTEN's close (a reply's terminator
        and ``</unit>``: 2 positions) and the second's audio tokens (the encoder's 50 positions a second over
        the pool). Their layer graphs are captured when the session starts, so no second pays their capture;
        any other width (a prelude's short suffix) is captured where it first runs."""
        return sorted(t for t in {2, self.audio_tokens()} if 1 < t <= GRAPHED_FEED)

    def audio_tokens(self) -> int:
        """The LLM positions a second's audio takes: the encoder's 50 positions a second over its pool."""
        return 50 // self.dims.audio.pool

    def _capture_llm_graphs(self) -> None:
        """The LLM's layer graphs over its store as it is now (at start, and after the store moved): the decode
        step's and the short feeds' (:meth:`feed_widths`); none where graphs are off or the store is stock."""
        self.llm_graphs: Optional[LayerGraphs] = None
        self.llm_feeds: Dict[int, LayerGraphs] = {}
        self.llm_exact: Optional[ExactForwards] = None       # made by prepare_ahead, over the store as it is
        if not self._graphs_on() or self.kv_llm.kind != "demand":
            return
        self.llm_graphs = make_layer_graphs(self.llm, self.kv_llm, self.device, True)
        for t in self.feed_widths():
            graphs = make_layer_graphs(self.llm, self.kv_llm, self.device, True, tokens=t)
            if graphs is not None:
                self.llm_feeds[t] = graphs

    def _tts_step(self, code: torch.Tensor, kv) -> torch.Tensor:
        if self.tts_graphs is not None and kv.kind == "demand":
            return self.tts_graphs.step(code, kv)
        return self.tts.step_code(code, kv)

    def _graphed_forward(self, embed: torch.Tensor):
        """A forward of ``embed``'s rows [t, hidden] (t from 1 to the protocol's ``GRAPHED_FEED``) over a demand
        store -> (final hidden [t, hidden], logits [1, V] for t 1, else None); or None: the eager path runs it.
        A one-token forward under a device's scheduler is batched with the other sessions' (batched_llm.py); the
        rest replay this session's layer graphs of that width (graphs on)."""
        if self.kv_llm.kind != "demand":
            return None
        if int(embed.shape[0]) == 1:
            out = yieldpoints.batched(LLM_STEP, self.llm, self, embed)
            if out is not None:
                return out
        if not self._graphs_on():
            return None
        return self.own_forward(embed)

    def own_forward(self, embed: torch.Tensor):
        """:meth:`_graphed_forward` of this session alone (a demand store): its layer graphs (graphs on) or the
        eager forward; the batched step's reference."""
        kv, t = self.kv_llm, int(embed.shape[0])
        if not self._graphs_on():
            h = self.llm(embed, kv)
            return h, (self.llm.logits(h) if t == 1 else None)
        if self.llm_exact is not None and self.llm_exact.valid_for(kv):    # only where ahead ran
            out = self.llm_exact.run(embed)                             # the forward prepared for this position
            if out is not None:
                return out
        if kv.length + t > kv.capacity:
            kv._room(kv.length + t)                                     # a long session: more room, new graphs
        graphs = self.llm_graphs if t == 1 else self.llm_feeds.get(t)
        if graphs is None or not graphs.valid_for(kv):
            graphs = make_layer_graphs(self.llm, kv, self.device, True, tokens=t)
            if t == 1:
                self.llm_graphs = graphs
            else:
                self.llm_feeds[t] = graphs
        return graphs.forward(embed)

    # -- the scheduler's batched step (engine.host.scheduler) ---------------------------------------------------
    def batch_runner(self, kind: str, group: object):
        """The runner of a batched step this backbone declares: its one-token LLM forward over ``group`` (its LLM)."""
        if kind != LLM_STEP or group is not self.llm:
            raise yieldpoints.NotBatched(kind)
        return LLMStepBatch(self.llm, self.device)

    def can_join_group(self) -> bool:
        """Whether this session's one-token forwards may run in a group step now: a demand store with a sink, and
        graphs on where the device captures (a session with graphs off runs its own eager steps)."""
        kv = self.kv_llm
        return kv.kind == "demand" and kv.sink is not None and (self.device.type != "cuda" or self._graphs_on())

    def next_forwards(self, slots: Optional[int] = None) -> List[tuple]:
        """The (tokens, start) of every LLM forward the next second may make (by the declared clocks), THINK's
        first slot and ``slots`` more (default: every slot a unit has)."""
        pending = self.protocol.pending_close
        if slots is None:
            slots = self.dims.sampling.max_tokens_per_unit - 1
        return next_forwards(self.kv_llm.length, len(pending) if pending else 0, self.audio_tokens(), slots)

    def prepare_ahead(self, scope: str = "tts", stop: Optional[Callable[[], bool]] = None) -> int:
        """Between seconds (the session's idle time): capture what the next second replays. ``scope``
        ``"tts"`` (the live session's default): in a reply past its prepared room, the TTS's per-length steps of
        the next worst-case second; ``"listen"``: the LLM's whole forwards of LISTEN and of THINK's first slot at
        their exact positions (:meth:`next_forwards`); ``"all"``: every LLM slot's, and the TTS's. A forward not
        prepared runs the layer graphs, with the same bits. ``stop`` (asked between captures): the next frame is
        here. Nothing where graphs are off. Returns the captures made.

        The LLM's scopes are not on by default: on the H200 capturing "all" took ~2 s per second, past the idle
        time."""
        if scope not in AHEAD_SCOPES:
            raise ValueError(f"ahead scope {scope!r}: choose one of {', '.join(AHEAD_SCOPES)}")
        if not hasattr(self, "protocol") or not self._graphs_on():
            return 0
        made = 0
        with torch.no_grad():
            llm = scope in ("listen", "all")
            if llm and self.kv_llm.kind == "demand" and self.device.type == "cuda":
                if self.llm_exact is None or not self.llm_exact.valid_for(self.kv_llm):
                    self.llm_exact = ExactForwards(self.llm, self.kv_llm, self.device)
                made += self.llm_exact.prepare(self.next_forwards(0 if scope == "listen" else None))
            if scope in ("tts", "all") and self.tts_graphs is not None and self.kv_tts.kind == "demand":
                made += self.tts_graphs.ahead(self.kv_tts, TTS_TOKENS_PER_SECOND, stop)
        return made

    # -- per second ------------------------------------------------------------------------------------
    def listen(self, audio: torch.Tensor, vad: "VadResult") -> None:
        """One second at 16 kHz (16000 samples, as the stock takes it) or 24 kHz (24000, the session's
        frames: resampled to 16 kHz first); see :class:`~.audio.FrontEnd`."""
        self._apply_toggles()
        self._speech = bool(vad.speech)
        with torch.no_grad():
            self._refresh_prefill()
            emb = self.executor.step({"features": self.front(audio)})["emb"]   # [10, llm hidden]
            if self._tap is not None:
                self._tap("encoder", emb)
            self._begin_llm_step()
            self.protocol.prefill(emb)

    def _begin_llm_step(self) -> None:
        """Open the second's LLM step: its worst case fits now, so no store moves mid-second. After a listening
        second the store also grows ahead when its room is near its end (GROW_AHEAD_SECONDS): a second that
        follows a listening one usually listens too (~80 ms of its 1,000), so the move lands where there is
        time. After any move the LLM's layer graphs are captured over the new storage at once, in this
        second, never later in a speaking one."""
        moved = self.kv_llm.begin_step(ahead=GROW_AHEAD_SECONDS if self._listened else 0)
        if moved is not None:
            self.grown_ahead += moved == "ahead"
            self._capture_llm_graphs()

    def force_listen(self) -> None:
        """The next second listens whatever the turn policy or the LLM would decide; a reply still open is
        closed first (``<|turn_eos|>`` fed, token2wav restarted): the duplex page's Force Listen."""
        self._force_listen = True

    def think(self, frames: int) -> Thought:
        turn = self.turns.decide(self._speech)          # counted every second, forced or not (as the stock's)
        if self._force_listen:
            turn, self._force_listen = TurnDecision("listen"), False
        with torch.no_grad():
            unit, hidden = self.protocol.decode(turn)
            self._listened = unit.decision == "listen"
            if unit.decision == "listen":
                # only a cut restarts token2wav: a reply the LLM closed inside a listening unit keeps its
                # buffer and state, and the next speaking second goes on from them (as in the stock loop)
                self._in_reply = self._in_reply and not unit.cut
                return Thought("listen", None, 0, text="", turn_end="cut" if unit.cut else "",
                               llm_ids=tuple(unit.ids))
            if self.stage_mark is not None:
                self.stage_mark("tts")
            self.kv_tts.begin_step()
            self.protocol.speak(unit, hidden)
        codes = unit.codes.view(1, -1)                                  # [1, n] int64 on the device
        parts: List[torch.Tensor] = []
        if not self._in_reply:                                          # a turn's buffer starts with silence
            parts.append(self._silence(LOOKAHEAD))
            self._in_reply = True
        parts.append(codes)
        if unit.end_of_turn:
            self._in_reply = False
        return Thought("speak", torch.cat(parts, dim=1), int(codes.shape[1]), text=self._text(unit.text_ids),
                       turn_end="end" if unit.end_of_turn else "", llm_ids=tuple(unit.ids),
                       codes=tuple(int(c) for c in unit.codes.tolist()))

    def _silence(self, n: int) -> torch.Tensor:
        return torch.full((1, n), SILENCE, dtype=torch.long, device=self.device)

    def _text(self, ids: List[int]) -> str:
        if self.folder is not None:
            return self.folder.tokenizer.decode(ids, skip_special_tokens=True)
        return "".join(f"<{i}> " for i in ids)

    # -- toggles and reporting ---------------------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        self._pending.ask(toggles)

    def _apply_toggles(self) -> None:
        pending = self._pending.take()
        if pending is None:
            return
        self._toggles = pending
        self.executor.set_toggles(pending)
        self.front.set_toggles(pending)
        demand = self._toggles.demand_sized
        p = self.protocol
        p.kv_llm = self.kv_llm = switch_store(self.kv_llm, demand, self.llm_capacity, self.device, growable=True,
                                              sink=True)
        new_tts = switch_store(self.kv_tts, demand, self.tts_capacity, self.device, growable=True)
        if new_tts is not self.kv_tts:
            self.tts_graphs = None                                      # graphs point into the old storage
        p.kv_tts = self.kv_tts = new_tts
        if self._graphs_on() and self.tts_graphs is None:
            # none prepared over the new store (its history may be mid-turn): the between-attention graphs
            # serve every length from here on
            self.tts_graphs = DecodeGraphs(self.tts, self.device, self.tts_prepared_length())
        elif not self._graphs_on():
            self.tts_graphs = None
        if self._graphs_on() and self.tts_prefill is None:
            self.tts_prefill = PrefillGraphs(self.tts, self.device, self.prefill_widest())   # captured later
        elif not self._graphs_on():
            self.tts_prefill = None
        if not self._graphs_on():
            self.llm_graphs = None
            self.llm_feeds = {}
            self.llm_exact = None

    def set_tap(self, tap: Optional[Callable[[str, torch.Tensor], None]]) -> None:
        """Hand each stage's output to ``tap(stage, tensor)`` as it is made (None stops it): ``encoder``
        (the second's audio tokens), ``llm_logits`` (after the prefill and every decode step), ``tts_logits``
        (every TTS step) and ``codes``. The tensors are fresh (nothing later writes into them); the session
        bench digests them after the second to find where two modes part (engine/bench/digests.py)."""
        self._tap = tap
        if hasattr(self, "protocol"):
            self.protocol.tap = tap

    def toggles(self) -> Toggles:
        return Toggles(self._toggles.demand_sized, self._graphs_on())

    def state_bytes(self) -> int:
        if not hasattr(self, "protocol"):
            return 0
        return int(self.executor.state_bytes() + self.front.state_bytes() + self.kv_llm.nbytes()
                   + self.kv_tts.nbytes())

    def horizon_bytes(self, seconds: float) -> int:
        """The state after ``seconds`` at the declared worst case: the LLM store grown to hold that many worst-case
        seconds past its history now (at most its positions), the rest as it is."""
        kv = self.kv_llm if hasattr(self, "kv_llm") else None
        if kv is None or kv.kind != "demand":
            return int(self.state_bytes())
        per_position = kv.nbytes() / max(1, kv.capacity + kv.spare)
        positions = min(self.dims.llm.max_positions, kv.length + LLM_TOKENS_PER_SECOND * int(seconds))
        return int(self.state_bytes() + max(0, positions - kv.capacity) * per_position)

    def shared_weights(self) -> Optional[Dict[str, object]]:
        """The LLM, TTS and encoder modules (read-only while stepping) for another session's backbone."""
        if not hasattr(self, "llm"):
            return None
        return {"llm": self.llm, "tts": self.tts, "encoder": self.encoder}

    def close(self) -> None:
        for name in ("protocol", "executor", "front", "llm", "tts", "encoder", "kv_llm", "kv_tts", "tts_graphs", "llm_graphs",
                     "llm_exact", "llm_feeds", "tts_prefill"):
            if hasattr(self, name):
                delattr(self, name)
