"""Decoder tails as the duplex session sees them: speech tokens in, audio out (resampled by the session).

:class:`DecoderTail` is the interface. :class:`EngineTail` is the glue every engine decoder shares:
the open-ended plan and its executor, ahead-of-time graph capture, the toggles (one
:class:`~engine.core.toggles.Toggles` value, applied at the next step), the frame buffer that runs
one engine step per complete second, the partial last second through a finite plan, state bytes and
silence tokens. A decoder package subclasses it with a few hooks (its model, its token check, the
codes of silence); every mode produces the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Dict, List, Optional

import numpy as np
import torch

from engine.core import Clock, Executor, Plan, SessionSpec, StepPlan, StreamingModel, make_plan, yieldpoints
from engine.core.planner import simulate_step   # the planner's own rule for one step's lengths
from engine.core.toggles import Toggles, graphs_can_run

if TYPE_CHECKING:
    from engine.fastpath import Verdict
    from engine.registry import TailChunking


@dataclass
class TailInfo:
    name: str               # registry name: "step-audio2", "mimi"
    title: str              # for people: "Step-Audio2 token2wav (Step-Audio-2-mini)"
    sample_rate: int        # the decoder's own audio rate (the session resamples it to SESSION_RATE)
    token_rate: float       # speech tokens (frames) per second of audio: 25 or 12.5
    codebooks: int          # tokens per frame (1 for Step-Audio2, 8/32 for Mimi)
    vocab: int              # token ids are in [0, vocab)
    size: str               # "released" | "tiny"
    synthetic_weights: bool # True when the weights are seeded random (no real voice)


#: full scale of 16-bit PCM as Step-Audio2's ``Token2wav.stream`` writes it (x 32767) and as MiniCPM-o's duplex
#: loop reads it back (/ 32768)
PCM16_WRITE, PCM16_READ = np.float32(32767.0), np.float32(32768.0)


def pcm16(audio: np.ndarray) -> np.ndarray:
    """float32 audio through 16-bit PCM and back, as a stock loop that hands speech on as PCM bytes does: clipped
    to [-1, 1], scaled by 32767, truncated toward zero to int16, read back divided by 32768 (float32). What the
    tail's cross-fade lifts past full scale is clipped here, as there."""
    x = np.asarray(audio, dtype=np.float32)
    return (np.clip(x, -1.0, 1.0) * PCM16_WRITE).astype("<i2").astype(np.float32) / PCM16_READ


def whole_second(audio: np.ndarray, rate: int) -> np.ndarray:
    """``audio`` after as much silence as makes it a whole second of ``rate`` samples (as it is when it is one or
    longer): how a stock loop that returns each speaking unit as at least a second returns a short one."""
    short = int(rate) - int(audio.shape[0])
    return np.concatenate([np.zeros(short, dtype=np.float32), audio]) if short > 0 else audio


class DecoderTail:
    """Base class: one streaming session of a decoder tail on the engine."""

    info: TailInfo
    #: hand the audio on through 16-bit PCM (:func:`pcm16`), as the backbone's own loop does (its registry
    #: entry's ``speech_pcm16``, set by the session before :meth:`start`); honoured by :class:`EngineTail`
    pcm16 = False

    def start(self, seed: int = 0) -> None:
        """Begin a new stream (plan, arena, executor; prompt prefill). Resets everything."""
        raise NotImplementedError

    def push(self, tokens: torch.Tensor) -> np.ndarray:
        """Feed the speech tokens of one second (int64, shape (codebooks, n)); return the float32
        audio that became ready (any length, possibly 0 while a lookahead fills)."""
        raise NotImplementedError

    def flush(self) -> np.ndarray:
        """End of stream: decode whatever is buffered (the last chunk)."""
        return np.zeros(0, dtype=np.float32)

    def set_toggles(self, toggles: Toggles) -> None:
        """The toggles from the next second on (the output never changes by a sample)."""
        raise NotImplementedError

    def toggles(self) -> Toggles:
        """The toggles in effect (graph replay reads False where there is no CUDA)."""
        raise NotImplementedError

    def state_bytes(self) -> int:
        """Bytes the tail's state arena holds now."""
        raise NotImplementedError

    def silence_tokens(self, n: int) -> torch.Tensor:
        """Tokens that decode to (near) silence, for seconds when the model listens."""
        raise NotImplementedError

    def shared_weights(self) -> Optional[Dict[str, object]]:
        """Read-only modules another stream of the same decoder can be built around (the registry's
        ``make_tail(..., shared=)``); None when this tail cannot share them."""
        return None

    def fast_paths(self) -> List["Verdict"]:
        """The start-up self-check's verdicts on this decoder's optional faster paths
        (:mod:`engine.fastpath`), for the session info; none by default."""
        return []


@dataclass
class DeclaredPlan(Plan):
    """An open-ended plan whose steps are declared one at a time, each from the chunk it runs: a stream whose
    chunks are not all full steps (MiniCPM-o's duplex loop decodes every buffer of at least 8 tokens each
    second, so a chunk of 8 to 28 tokens may come at any step).

    Regions, session and demand sizes are the base plan's, and so is the timeline the executor captures
    ahead of time (the full steps' signatures); :meth:`declare` gives step ``k`` the shapes that the steps
    declared before it leave, by the planner's own rule for one step (each region's retention applied to
    the declared advance), so a full step after short ones gets the lengths its history gives it and a
    short step a signature of its own (a graph of its own, captured the first time it runs; no padding).
    A chunk never outgrows the base plan's demand (:meth:`declare` checks), so the arena never moves."""

    declared: List[StepPlan] = field(default_factory=list)

    @classmethod
    def over(cls, base: Plan) -> "DeclaredPlan":
        return cls(base.regions, base.spec, list(base.timeline), dict(base.demand), base.settled_at, base.period)

    def step(self, k: int) -> StepPlan:
        if 0 <= k < len(self.declared):
            return self.declared[k]
        raise RuntimeError(f"step {k} runs before its chunk was declared ({len(self.declared)} declared)")

    def reset(self) -> None:
        """Back to step 0 (a new turn restarts the stream from its prompt state)."""
        self.declared.clear()

    def declare(self, advances: Dict[str, int], last: bool = False, grow: bool = False) -> StepPlan:
        """Step ``len(declared)``: ``advances`` by clock name (clocks not named advance as declared); ``last``:
        the stream's last step. ``grow``: raise the demand where the step needs more (a finite copy only)."""
        k = len(self.declared)
        lengths = self.declared[-1].after if self.declared else {
            r.name: r.retention.initial(int(self.spec.prefix.get(r.name, 0))) for r in self.regions}
        regions = [replace(r, clock=Clock(r.clock.name, (int(advances[r.clock.name]),), r.clock.rate_hz))
                   if r.clock.name in advances else r for r in self.regions]
        sp = simulate_step(regions, lengths, k, SessionSpec(prefix=self.spec.prefix))
        sp = replace(sp, is_last=bool(last))
        for r in self.regions:
            need = max(sp.before[r.name], sp.grown[r.name], sp.after[r.name])
            if need > self.demand[r.name] and not grow:
                raise ValueError(f"step {k} needs {need} units of {r.name}, past the plan's {self.demand[r.name]}: "
                                 f"a chunk may not be longer than a full step")
            self.demand[r.name] = max(self.demand[r.name], need)
        self.declared.append(sp)
        return sp

    def finished(self, advances: Dict[str, int]) -> "DeclaredPlan":
        """A finite copy: the steps declared so far, then the stream's last step of ``advances`` (its
        demand raised where that step needs more)."""
        done = DeclaredPlan(self.regions, replace(self.spec, steps=len(self.declared) + 1), [], dict(self.demand),
                            None, 1, list(self.declared))
        done.declare(advances, last=True, grow=True)
        done.timeline = list(done.declared)
        return done


class EngineTail(DecoderTail):
    """One streaming session of an engine decoder whose steps are whole seconds of frames.

    The model (a :class:`~engine.core.model.StreamingModel`) declares a clock named ``frames`` whose
    advance is the frames a step consumes (12 or 13 at 12.5 Hz), takes ``{"codes": [K, n]}`` and
    returns ``{"audio": [..., samples]}``, and provides ``spec(steps=, last_frames=)`` and
    ``example_inputs(plan, device)``. Subclasses give :meth:`zero_codes` (the codes of silence) and
    may check tokens further in :meth:`check_tokens`. A decoder that reads ahead (Step-Audio2's
    encoder: 3 tokens) sets ``lookahead``: a step then runs once its frames and the lookahead are
    there, and consumes only its own frames. A stream that starts from a prompt gives
    :meth:`prefill`; one that draws random numbers seeds them in :meth:`seed_stream`.
    """

    frames_clock = "frames"
    lookahead = 0
    keep_turn_base = False      # set before start() by a session whose backbone speaks in turns (new_turn)
    #: set before start() from the backbone's entry (``BackboneEntry.tail_chunking``, MiniCPM-o 4.5's): every
    #: push runs all it can, in chunks of at most a full step, down to a chunk of ``chunking.min_frames`` new
    #: frames plus the lookahead; such chunks are steps of a :class:`DeclaredPlan`. None: a push waits for
    #: full steps.
    chunking: Optional["TailChunking"] = None

    def __init__(self, model: StreamingModel, info: TailInfo, device, toggles: Optional[Toggles] = None):
        self.model, self.info, self.device = model, info, torch.device(device)
        self._toggles = toggles if toggles is not None else Toggles(True, graphs_can_run(self.device))
        self.plan: Plan = self._plan(self.session_spec())
        self.executor: Optional[Executor] = None
        self._declared: Optional[DeclaredPlan] = None
        self._chunking: Optional["TailChunking"] = None
        self._buf = torch.zeros((info.codebooks, 0), dtype=torch.int64)
        self._ended = False
        self._silence: Optional[torch.Tensor] = None

    # -- hooks -----------------------------------------------------------------------------------------
    def session_spec(self, steps: Optional[int] = None, last_frames: Optional[int] = None) -> SessionSpec:
        """The model's session: open-ended (``steps=None``) or finite with a short last second."""
        return self.model.spec(steps=steps, last_frames=last_frames)

    def _plan(self, spec: SessionSpec) -> Plan:
        return make_plan(self.model.regions(spec), spec)

    def example_inputs(self, sp: StepPlan) -> Dict[str, torch.Tensor]:
        return self.model.example_inputs(sp, self.device)

    def step_inputs(self, chunk: torch.Tensor) -> Dict[str, torch.Tensor]:
        """A step's inputs from its frames (and lookahead), int64 [K, n] on the CPU."""
        return {"codes": chunk.to(self.device)}

    def seed_stream(self, seed: int) -> None:
        """Seed what the stream draws (after graph capture, before the prefill); nothing by default."""

    def prefill(self, seed: int) -> Dict[str, torch.Tensor]:
        """The prompt the model's ``init_state`` fills the state from; none by default."""
        return {}

    def zero_codes(self) -> torch.Tensor:
        """The codes (one per codebook, int64 [K]) of a frame of silence."""
        raise NotImplementedError

    def check_tokens(self, tokens) -> torch.Tensor:
        """Tokens as int64 [K, n] on the CPU, or ValueError: K codebooks, integers in [0, vocab)."""
        t = tokens if isinstance(tokens, torch.Tensor) else torch.as_tensor(np.asarray(tokens))
        k, vocab = self.info.codebooks, self.info.vocab
        if t.dim() != 2 or t.shape[0] != k:
            raise ValueError(f"{self.info.name} codes must be (codebooks={k}, frames), got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
            raise ValueError(f"{self.info.name} codes must be integers, got {t.dtype}")
        t = t.to("cpu", torch.int64)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab):
            raise ValueError(f"{self.info.name} codes must lie in [0, {vocab}), got values in "
                             f"[{int(t.min())}, {int(t.max())}]")
        return t

    # -- stream ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def start(self, seed: int = 0) -> None:
        """New stream: fresh state, graphs captured ahead of time where they can run."""
        self._chunking = self.chunking          # the rule this stream runs by (as it was at start)
        self._declared = DeclaredPlan.over(self.plan) if self._chunking is not None else None
        ex = Executor(self.model, self._declared or self.plan, self.device, **self._toggles)
        ex.prepare_graphs(self.example_inputs, extra=self._usual_last_steps())
        self.seed_stream(seed)
        ex.init_state(self.prefill(seed))
        self.executor = ex
        self._live = ex
        # what new_turn() restores: the state right after the prompt prefill (the stock keeps such a
        # copy too: its flow_cache_base); taken only for a backbone that speaks in turns
        self._turn_base = (ex.arena.export(), dict(ex.arena.positions)) if self.keep_turn_base else None
        self._buf = self._buf[:, :0]
        self._ended = False

    @torch.no_grad()
    def new_turn(self, flush: bool = True) -> np.ndarray:
        """End the current turn of the stream and begin the next one, as a stock duplex loop does at
        every turn end: with ``flush`` the buffered frames are decoded as the turn's last chunk (the
        returned audio); without it (the reply was cut) they are dropped. The state then goes back to
        what :meth:`start` left (the prompt prefill; graphs kept, nothing recaptured), the buffer is
        emptied and the next step is step 0 again. The random generators go on (they are not reseeded).
        Needs ``keep_turn_base`` set before :meth:`start`."""
        self._require_stream()
        if self._turn_base is None:
            raise RuntimeError(f"{self.info.name}: new_turn needs keep_turn_base set before start()")
        audio = self.flush() if flush else np.zeros(0, dtype=np.float32)
        self.executor, self._ended = self._live, False
        self.executor.restart(*self._turn_base)
        if self._declared is not None:
            self._declared.reset()
        self._buf = self._buf[:, :0]
        return audio

    @property
    def seconds_done(self) -> int:
        return 0 if self.executor is None else self.executor.k

    def frames_needed(self) -> int:
        """Frames the next second takes (its step's advance of the frames clock)."""
        return self.frames_in(self.plan.step(self.seconds_done))

    def frames_in(self, sp: StepPlan) -> int:
        """Frames step ``sp`` consumes: its advance of the ``frames`` clock."""
        return sp.advances[self.frames_clock]

    @torch.no_grad()
    def push(self, tokens) -> np.ndarray:
        """Buffer ``tokens`` [K, n] and decode every second that is complete."""
        self._require_stream()
        self._buf = torch.cat([self._buf, self.check_tokens(tokens)], dim=1)
        chunks = []
        while True:
            n = self._next_frames()
            if n == 0:
                break
            chunk, self._buf = self._buf[:, :n + self.lookahead], self._buf[:, n:]
            if self._declared is not None:
                self._declared.declare(self._advances(n))
            chunks.append(self._audio(self.executor.step(self.step_inputs(chunk))))
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    def _next_frames(self) -> int:
        """New frames the next step consumes now: a full step's when they and the lookahead are buffered;
        with ``chunking``, else all but the lookahead once that is ``chunking.min_frames``; otherwise 0 (wait)."""
        full, have = self.frames_needed(), int(self._buf.shape[1])
        if have >= full + self.lookahead:
            return full
        if self._chunking is not None and have >= self._chunking.min_frames + self.lookahead:
            return have - self.lookahead
        return 0

    def _advances(self, n: int) -> Dict[str, int]:
        """The clock advances of a step that consumes ``n`` frames (a full step's, or the model's own
        mapping for a short one: its session's ``last_advance`` for ``n`` frames)."""
        sp = self.plan.step(self.seconds_done)
        if n == self.frames_in(sp):
            return dict(sp.advances)
        return dict(self.session_spec(steps=1, last_frames=n).last_advance)

    @torch.no_grad()
    def flush(self) -> np.ndarray:
        """End the stream: the buffered frames run as its last step. A chunked stream declares it on its own
        plan and runs it on its own executor (a graph where :meth:`start` prepared that step's shapes, else
        eagerly); otherwise the partial second runs as the last step of a finite plan (the state moves over by
        exact copies; the step runs eagerly)."""
        self._require_stream()
        self._ended = True
        n = int(self._buf.shape[1])
        if n == 0:
            return np.zeros(0, dtype=np.float32)
        chunk, self._buf = self._buf, self._buf[:, :0]
        if self._declared is not None and self._declare_last(n):
            return self._audio(self.executor.step(self.step_inputs(chunk)))
        k, old = self.executor.k, self.executor
        if self._declared is not None:          # after the chunks declared so far
            plan = self._declared.finished(self._advances(n))
        else:
            plan = self._plan(self.session_spec(steps=k + 1, last_frames=n))
        ex = Executor(self.model, plan, self.device, demand_sized=old.arena.kind == "demand",
                      graph_replay=old.toggles().graph_replay)   # a one-off last step: it runs eagerly
        ex.arena.load(old.arena.export(), dict(old.arena.positions), k)
        ex.k = k
        self.executor = ex
        return self._audio(ex.step(self.step_inputs(chunk)))

    def _declare_last(self, n: int) -> bool:
        """Declare the stream's last step of ``n`` frames on its own plan; False where it would need more state
        than the plan holds (the caller then runs it on a finite copy)."""
        try:
            self._declared.declare(self._advances(n), last=True)
        except ValueError:
            return False
        return True

    def _usual_last_steps(self) -> List[StepPlan]:
        """The last step a chunked stream usually ends with, for :meth:`start` to capture ahead: the lookahead's
        frames alone (a turn whose last push ran a chunk keeps exactly those) once the state has settled (every
        region at its steady length, whatever chunks came before). Nothing for a stream that is not chunked
        or reads no lookahead."""
        if self._chunking is None or self.lookahead <= 0:
            return []
        scratch = DeclaredPlan.over(self.plan)
        prev = None
        for k in range(64):
            sp = scratch.declare(dict(self.plan.step(k).advances))
            if prev is not None and sp.before == prev.before:
                last = self.session_spec(steps=1, last_frames=self.lookahead).last_advance
                return [scratch.declare(dict(last), last=True)]
            prev = sp
        return []

    def _audio(self, out: Dict[str, torch.Tensor]) -> np.ndarray:
        """A step's audio as float32 on the host (through 16-bit PCM where :attr:`pcm16` says so); under a device's
        scheduler the session parks until the audio is done, so the read never holds the others back."""
        audio = out["audio"].reshape(-1).float()
        yieldpoints.wait()
        audio = audio.cpu().numpy()
        return pcm16(audio) if self.pcm16 else audio

    def _require_stream(self) -> None:
        if self.executor is None or self._ended:
            raise RuntimeError(f"no open {self.info.name} stream: call start() first (flush() ends a stream)")

    # -- toggles and reporting ---------------------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        """Requested toggles apply from the next second (and to the next stream)."""
        self._toggles = toggles
        if self.executor is not None and not self._ended:
            self.executor.set_toggles(toggles)

    def toggles(self) -> Toggles:
        if self.executor is None or self._ended:
            return self._toggles.effective(self.device)
        return self.executor.toggles()

    def state_bytes(self) -> int:
        """The arena's bytes, plus the turn base kept for :meth:`new_turn` (when kept)."""
        if self.executor is None:
            return 0
        base = getattr(self, "_turn_base", None)
        kept = 0 if base is None else sum(t.numel() * t.element_size() for t in base[0].values())
        return self.executor.state_bytes() + kept

    def silence_tokens(self, n: int) -> torch.Tensor:
        if self._silence is None:
            self._silence = self.zero_codes().to("cpu", torch.int64)
        return self._silence[:, None].expand(-1, int(n)).clone()

    def shared_weights(self) -> Optional[Dict[str, object]]:
        """The decoder module (read-only while streaming): another stream can be built around it."""
        return {"model": self.model}
