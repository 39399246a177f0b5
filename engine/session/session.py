"""The duplex session: one second of microphone in, LISTEN -> THINK -> SPEAK, one second of speech out.

Output of second k plays during second k+1, so second k's work is due when frame k+1 arrives
(1,000 ms after frame k). Every second leaves a :class:`~engine.session.records.SecondRecord`.

The decoder tail returns whatever audio became ready (a lookahead may hold some back; Mimi's
12.5 Hz frames give 23,040 or 24,960 samples a second); an output FIFO hands out exactly one
second each time, zero-filled *before* the audio while the tail is still priming, so the stream
stays continuous (a tail at another sample rate is resampled to 24 kHz on the way). Likewise tokens a backbone has not produced yet (Moshi's acoustic delay) are
filled with the tail's silence tokens in front. Neither depends on the toggles: every mode gives
the same bits.
"""
from __future__ import annotations

import atexit
import gc
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from engine.audio import SESSION_RATE
from engine import fastpath, registry
from engine.backbones import Backbone, TokenFormat
from engine.core import graphs
from engine.finite import check_audio
from engine.core.toggles import PendingToggles, Toggles
from engine.tail import DecoderTail, whole_second

from . import devicemem
from .card_memory import device_memory
from .config import SessionConfig
from .records import DEADLINE_MS, SecondRecord, lateness, summarize
from .timing import StageClock, allocator_bytes
from engine.vad import EnergyVAD

RATE = SESSION_RATE          # the one 24 kHz constant (engine.audio)
SYNTHETIC_RMS = 0.1          # about -20 dBFS: playback level of a synthetic-weights tail's speech


class AudioFifo:
    """Samples from the tail, handed out one second at a time: zeros in front while priming (before the
    first audio); after that an underrun plays what is left first, then zeros (the end of a reply whose
    last chunk ran longer than a second follows its speech at once)."""

    def __init__(self):
        self.buf = np.zeros(0, dtype=np.float32)
        self.primed = False

    def push(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        if x.size:
            self.buf = np.concatenate([self.buf, x])

    def pop(self, n: int = RATE) -> np.ndarray:
        if self.buf.size >= n:
            out, self.buf = self.buf[:n].copy(), self.buf[n:]
            self.primed = True
            return out
        out = np.zeros(n, dtype=np.float32)
        if self.primed:
            out[:self.buf.size] = self.buf
        else:
            out[n - self.buf.size:] = self.buf
            self.primed = self.buf.size > 0
        self.buf = np.zeros(0, dtype=np.float32)
        return out


class RateConverter:
    """Streaming conversion of a tail's output rate to the session's 24 kHz (identity when equal).

    A tail at another rate (the tiny Mimi decodes at 1.2 kHz) is resampled with soxr's streaming
    resampler, which keeps its filter state across seconds: no clicks at second boundaries, and
    the same input bits always give the same output bits.
    """

    def __init__(self, rate_in: int, rate_out: int = RATE):
        self.stream = None
        if int(rate_in) != int(rate_out):
            import soxr
            self.stream = soxr.ResampleStream(int(rate_in), int(rate_out), 1, dtype="float32", quality="HQ")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1))
        return x if self.stream is None else self.stream.resample_chunk(x)


def cpu_threads(requested: int = 0) -> int:
    """Torch threads for a CPU session: ``requested``, or all cores but one (at least one)."""
    if requested > 0:
        return int(requested)
    return max(1, (os.cpu_count() or 1) - 1)


def check_frame(frame, rate: int = RATE) -> np.ndarray:
    """A one-second mono frame as float32 (rate,), or ValueError saying what is wrong."""
    x = np.asarray(frame)
    if x.ndim != 1 or x.shape[0] != rate:
        raise ValueError(f"a session frame is one second of mono {rate // 1000} kHz audio (the session's "
                         f"input_rate), shape ({rate},); got {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"a session frame holds float samples in [-1, 1]; got dtype {x.dtype}")
    x = x.astype(np.float32, copy=False)
    if not np.all(np.isfinite(x)):
        raise ValueError("a session frame holds NaN or infinite samples")
    return x


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


_thawed_at_exit = False


def _freeze() -> None:
    """``gc.freeze()``, and once per process the frozen objects handed back at exit, so the interpreter's last
    collection still finalizes them (extension objects left frozen are reported as leaks at exit)."""
    global _thawed_at_exit
    if not _thawed_at_exit:
        atexit.register(gc.unfreeze)
        _thawed_at_exit = True
    gc.freeze()


class DuplexSession:
    """One live conversation: a backbone (LISTEN + THINK) in front of a decoder tail (SPEAK).

    ``DuplexSession(cfg).start()`` builds both; :meth:`process` runs one second;
    :meth:`set_toggles` changes the engine toggles from the next second on (the output does not
    change by a single sample). ``tail`` may be given to run a ready-built decoder tail.
    """

    def __init__(self, cfg: SessionConfig, tail: Optional[DecoderTail] = None,
                 backbone_shared: Optional[Dict[str, object]] = None):
        self.cfg = cfg.resolved()
        self._backbone_shared = backbone_shared    # another session's backbone weights (engine.host)
        self.device = torch.device(self.cfg.device)
        self.records: List[SecondRecord] = []
        self.tail: Optional[DecoderTail] = tail
        self.backbone: Optional[Backbone] = None
        self.fmt: Optional[TokenFormat] = None
        self.vad = EnergyVAD(self.cfg.input_rate)
        self.fifo = AudioFifo()
        self._toggles = PendingToggles(Toggles(self.cfg.demand_sized, self.cfg.graph_replay))
        self._started = False
        self.build_peak_reserved = 0                 # CUDA: torch's peak reserved bytes during the build
        self._info: Optional[Dict[str, object]] = None
        self._oom: Optional[devicemem.Guard] = None    # out of memory -> DeviceTooSmall; built by start()
        self._turn_flush = False                     # a reply ended: its last chunk runs next second
        self.last_speech = np.zeros(0, dtype=np.float32)   # what the tail produced in the last second (24 kHz)
        self.parts = registry.get_backbone(self.cfg.backbone)     # the backbone's traits

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Build the tail and the backbone (may take seconds); the first second starts seeded."""
        c = self.cfg
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(c.cpu_threads))
        torch.manual_seed(c.seed)
        self._oom = devicemem.Guard(self.device, c.backbone, c.size)      # entered again each second
        with self._oom("to start the session", devicemem.free_gib(self.device)):
            self._build()
        # graph captures restore the RNG they used; seeding here makes second 0 start identically
        # whichever toggles the session was built with
        torch.manual_seed(c.seed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            # the build's peak (since the caller last reset it); then what the build left cached and free
            # (warm-ups' blocks, dead self-check graphs) goes back before the seconds' peak is measured
            self.build_peak_reserved = int(torch.cuda.max_memory_reserved(self.device))
            graphs.release_cached(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        # the build's long-lived objects (modules, graphs, state) leave the cyclic collector's generations: a
        # full collection over them stalled a MiniCPM-o second by ~350 ms at a random moment (H200)
        _freeze()
        self._started = True

    def _build(self) -> None:
        c = self.cfg
        if self.tail is None:
            entry, extra = registry.get_tail(c.tail), {}
            if entry.conditioning is not None:   # the voice the config chose (a file's errors name the file)
                extra[entry.conditioning.keyword] = entry.conditioning.load(c.voice, c.checkpoint, c.seed)
            extra.update(self.parts.tail_kwargs())    # how the backbone has its tail built (MiniCPM-o: 5 steps)
            self.tail = entry.make_tail(size=c.size, device=str(self.device), seed=c.seed,
                                        checkpoint=c.checkpoint, **extra)
        if self.parts.speaks_in_turns:
            self.tail.keep_turn_base = True     # the tail starts each turn afresh (DecoderTail.new_turn)
        if self.parts.tail_chunking is not None:
            self.tail.chunking = self.parts.tail_chunking   # short chunks, as the backbone's loop decodes them
        self.tail.pcm16 = self.parts.speech_pcm16   # its speech as 16-bit PCM, as the backbone's loop hands it on
        asked = Toggles(c.demand_sized, c.graph_replay).on(self.device)    # graphs asked only where they run
        self.tail.set_toggles(asked)
        self.tail.start(seed=c.seed)
        ti = self.tail.info
        self.fmt = TokenFormat(ti.codebooks, ti.vocab, ti.token_rate)
        self.to_session_rate = RateConverter(ti.sample_rate, RATE)
        self.backbone = self.parts.make(self.fmt, size=c.size, device=self.device, seed=c.seed,
                                        checkpoint=c.backbone_checkpoint, **self._offered(),
                                        demand_sized=asked.demand_sized, graph_replay=asked.graph_replay,
                                        reply_seconds=c.reply_seconds, debug=c.debug,
                                        shared=self._backbone_shared)
        self.backbone.start()

    def _offered(self) -> Dict[str, object]:
        """The keywords of what the backbone's entry declares it takes: the system prompt asked for (its own
        default otherwise) and, as its reference clip, the voice chosen (the backbone reads what the file holds)."""
        c, out = self.cfg, {}
        if c.system_prompt is not None:
            out["system_prompt"] = c.system_prompt
        if c.voice and self.parts.reference_clip:
            out["reference_audio"] = c.voice
        return out

    def close(self) -> None:
        """Release the models; ``records`` and ``info`` stay."""
        if self.tail is not None:
            self._info = self.info
        if self.backbone is not None:
            self.backbone.close()
        self.backbone = None
        self.tail = None
        if self._started:
            # what start() froze comes back to the collector, so this session's reference cycles (graphs hold
            # device memory) are collected now; what other sessions still hold is frozen again
            gc.unfreeze()
            gc.collect()
            _freeze()
        self._started = False

    @property
    def info(self) -> Dict[str, object]:
        """What runs: model names and titles, whether the weights are synthetic, device, size, system prompt."""
        if self.tail is None and self._info is not None:
            return dict(self._info)
        ti = self.tail.info if self.tail is not None else None
        bi = self.backbone.info if self.backbone is not None else None
        synthetic = bool(ti and ti.synthetic_weights) or (ti is None and bool(bi and bi.synthetic))
        return {
            "tail": self.cfg.tail, "backbone": self.cfg.backbone,
            "tail_title": ti.title if ti else self.cfg.tail,
            "backbone_title": bi.title if bi else self.cfg.backbone,
            "synthetic": synthetic,
            "note": ("synthetic weights: timing and memory are real; the voice is not speech — "
                     "load a checkpoint folder for a real voice") if synthetic else
                    ("synthetic backbone: its speech tokens are random, so the checkpoint's voice says no words "
                     "(the moshi backbone holds a conversation)") if bi and bi.synthetic else "",
            "device": str(self.device), "size": self.cfg.size,
            "voice": self.cfg.voice_label(),
            # a plug-in part may have none; a path checked at many lengths is one line (fastpath.summarize)
            "fast_paths": fastpath.summarize([v for part in (self.tail, self.backbone) if part is not None
                                              for v in getattr(part, "fast_paths", list)()]),
            **device_memory(self.device),    # the card's size and the process cap, MiB (None on the CPU)
            # the text the backbone started from (its declared default when none was given); None: it takes none
            "system_prompt": (self.cfg.system_prompt if self.cfg.system_prompt is not None
                              else self.parts.system_prompt),
        }

    # -- toggles -------------------------------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        """Effective from the next second (thread-safe); the output never changes by a sample."""
        self._toggles.ask(toggles)

    def asked_toggles(self) -> Toggles:
        """The toggles last asked for (applied or still pending; graph replay as asked, CUDA or not)."""
        return self._toggles.asked

    def toggles(self) -> Toggles:
        """Toggles in effect (graph replay reads False without CUDA)."""
        t = self.tail.toggles() if self.tail is not None else {}
        return Toggles(bool(t.get("demand_sized", self.cfg.demand_sized)), bool(t.get("graph_replay", False)))

    def _apply_toggles(self) -> None:
        pending = self._toggles.take()
        if pending is not None:
            self.cfg = self.cfg.replace(demand_sized=pending.demand_sized, graph_replay=pending.graph_replay)
            asked = pending.on(self.device)
            self.tail.set_toggles(asked)
            self.backbone.set_toggles(asked)

    # -- one second ----------------------------------------------------------------------------------
    def process(self, frame, arrival: Optional[float] = None, backlog: int = 0,
                force_listen: bool = False) -> Tuple[np.ndarray, SecondRecord]:
        """Run one second of ``cfg.input_rate`` samples (24 kHz; 16 kHz where the backbone takes its native
        rate: handed to it as is). ``arrival``: ``time.perf_counter()`` when the frame came in (defaults to
        now: no queueing); ``backlog``: frames still waiting behind this one; ``force_listen``: this second
        the backbone listens whatever it would decide, closing a reply that is open (the duplex page's Force
        Listen; backbones whose entry declares ``force_listen`` only)."""
        if not self._started:
            raise RuntimeError("the session is not started: call start() first")
        x = check_frame(frame, self.cfg.input_rate)
        if force_listen:
            if not self.parts.force_listen:
                raise ValueError(f"the {self.cfg.backbone} backbone takes no forced listen")
            self.backbone.force_listen()
        wall_start, t0 = time.time(), time.perf_counter()
        queue_wait = max(0.0, (t0 - arrival) * 1000.0) if arrival is not None else 0.0
        self._apply_toggles()
        toggles = self.toggles()
        k = len(self.records)
        frames = self.fmt.frames_in_second(k)
        clock = StageClock(self.device)
        with torch.no_grad(), self._oom(f"in second {k}"):
            early = np.zeros(0, dtype=np.float32)
            if self._turn_flush:                 # the last reply's last chunk, deferred (see _speak)
                clock.mark("flush")
                early, self._turn_flush = self.tail.new_turn(flush=True), False
            clock.mark("listen")
            vad = self.vad(x)
            self.backbone.listen(torch.from_numpy(x).to(self.device), vad)
            clock.mark("think")
            if self.parts.stage_marks:         # a backbone that marks parts of THINK ("tts") on the clock
                self.backbone.stage_mark = clock.mark
            thought = self.backbone.think(frames)
            clock.mark("speak")
            audio, tail_skipped = self._speak(thought, frames)
            tail_skipped = tail_skipped and not early.size      # a deferred last chunk ran this second
            clock.mark("end")
        ms = clock.stages()
        ms["speak"] += ms.pop("flush", 0.0)          # token2wav work, wherever it runs
        think_tts = ms.pop("tts", 0.0)
        ms["think"] += think_tts                      # THINK whole; its TTS part on its own
        self.last_speech = self.to_session_rate(np.concatenate([early, audio]) if early.size else audio)
        check_audio(self.last_speech, f"second {k}: the {self.cfg.tail} tail's audio")     # once a second
        self.fifo.push(self.last_speech)
        out = self._playback_level(self.fifo.pop(RATE), thought.decision)
        total = (time.perf_counter() - t0) * 1000.0
        late, missed = lateness(queue_wait, total, DEADLINE_MS)
        alloc, reserved, peak = allocator_bytes(self.device)
        rec = SecondRecord(
            index=k, wall_start=wall_start, listen_ms=ms["listen"], think_ms=ms["think"], speak_ms=ms["speak"],
            total_ms=total, deadline_ms=DEADLINE_MS, late_ms=late, missed=missed, queue_wait_ms=queue_wait,
            decision=thought.decision, tokens=int(thought.produced),
            state_bytes=int(self.tail.state_bytes()) + int(self.backbone.state_bytes()),
            alloc_bytes=alloc, reserved_bytes=reserved, peak_bytes=peak,
            demand_sized=toggles["demand_sized"], graph_replay=toggles["graph_replay"],
            tail=self.cfg.tail, backbone=self.cfg.backbone, input_rms=rms(x), output_rms=rms(out),
            user_speech=bool(vad.speech), backlog=int(backlog), text=thought.text, tail_skipped=tail_skipped,
            llm_tokens=" ".join(map(str, thought.llm_ids)), tts_codes=" ".join(map(str, thought.codes)),
            think_tts_ms=think_tts)
        self.records.append(rec)
        return out, rec

    def held_speech(self) -> np.ndarray:
        """At the end of a session: the speech the engine's schedule still holds for the next second (a reply's
        last chunk, decoded first thing in the second after its turn ended), decoded now, at 24 kHz; empty when
        none is held. The stock-like mode decodes it in its own second, so both give the same speech."""
        if not self._started or not self._turn_flush:
            return np.zeros(0, dtype=np.float32)
        with torch.no_grad(), self._oom("finishing the session"):
            audio, self._turn_flush = self.tail.new_turn(flush=True), False
        return self.to_session_rate(audio)

    def ahead(self, scope: Optional[str] = None, stop: Optional[Callable[[], bool]] = None) -> float:
        """After a second, in the time before the next frame: let the backbone capture what the next second
        replays (backbones whose entry declares ``ahead``; graphs on; a forward it did not prepare runs the slower
        graphs, with the same bits). Its time and captures go on the last second's record (``ahead_ms``,
        ``ahead_captures``), never into its total. Returns the ms spent. ``scope``: what to prepare (the
        entry's declared ``ahead``; None: the config's ``ahead``, "off" for nothing); ``stop``: asked between
        captures, True once the next frame is waiting (the live worker's queue)."""
        scope = self.cfg.ahead if scope is None else scope
        if scope not in self.parts.ahead or not self.records:
            return 0.0
        t0 = time.perf_counter()
        with torch.no_grad(), self._oom("preparing the next second"):
            made = int(self.backbone.prepare_ahead(scope, stop))
        ms = (time.perf_counter() - t0) * 1000.0
        rec = self.records[-1]
        rec.ahead_ms += ms
        rec.ahead_captures += made
        return ms

    def _playback_level(self, out: np.ndarray, decision: str) -> np.ndarray:
        """What the speaker gets. A tail on seeded random weights decodes noise near full scale, even
        from silence tokens: its listen seconds are played as silence and its speech is brought down
        to about -20 dBFS, so a live session stays bearable. Real weights play exactly as decoded."""
        ti = getattr(self.tail, "info", None)
        if not (ti and ti.synthetic_weights):
            return out
        if decision != "speak":
            return np.zeros_like(out)
        level = rms(out)
        return out * np.float32(min(1.0, SYNTHETIC_RMS / level)) if level > 0 else out

    def _speak(self, thought, frames: int) -> Tuple[np.ndarray, bool]:
        """SPEAK: the tail decodes the second's tokens; returns (audio, whether the tail was skipped).

        A backbone whose entry says ``listen_skips_tail`` (a listening second runs no backbone decoder and
        no tail) hands over its speaking tokens as they are (a reply's silence prefix and lookahead
        included) and skips the tail while it listens: the second plays silence."""
        if self.parts.listen_skips_tail:
            audio = np.zeros(0, dtype=np.float32) if thought.tokens is None else self.tail.push(thought.tokens)
            if thought.turn_end == "end" and self.toggles()["demand_sized"]:
                # the engine's schedule: the turn's last chunk (audio that plays only after this second's
                # output) runs first thing next second, before anything draws; same draws in the same
                # order, same samples out. Stock-like: in this second, as the stock loop runs it.
                self._turn_flush = True
            elif thought.turn_end:      # the tail's next turn starts from the prompt, as the stock's does
                audio = np.concatenate([audio, self.tail.new_turn(flush=thought.turn_end == "end")])
            if self.parts.pads_short_speech and thought.tokens is not None and thought.turn_end != "end":
                audio = whole_second(audio, self.tail.info.sample_rate)     # a short unit, as its loop returns it
            return audio, thought.tokens is None
        return self.tail.push(self._tail_tokens(thought.tokens, frames)), False

    def _tail_tokens(self, tokens: Optional[torch.Tensor], frames: int) -> torch.Tensor:
        """The second's (codebooks, frames) tokens for the tail; silence fills what is missing, in front."""
        if tokens is None:
            return self.tail.silence_tokens(frames).to(self.device)
        n = tokens.shape[-1]
        if n > frames:
            raise RuntimeError(f"the backbone produced {n} frames for a second of {frames}")
        if n < frames:
            pad = self.tail.silence_tokens(frames - n).to(device=tokens.device, dtype=tokens.dtype)
            tokens = torch.cat([pad, tokens], dim=-1)
        return tokens

    def summary(self) -> Dict[str, object]:
        """Seconds, misses, p50/p99 totals (see :func:`engine.session.records.summarize`)."""
        return summarize(self.records)
