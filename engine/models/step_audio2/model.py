"""Step-Audio2 token2wav as an engine :class:`~engine.core.model.StreamingModel`.

One step = one streamed chunk: 25 new speech tokens + 3 lookahead (all remaining tokens on the last
chunk) -> flow -> 50 mel frames -> HiFT with the 8-frame mel / 3,840-sample source overlap -> cross-fade
with the previous chunk's tail (Hamming) -> the audio that is final (24,000 samples a second).

State regions (``regions``), with the clock that advances them and how long they are kept:

=============  =========================================  ======  ============================  ======================
region         shape                                      clock   retention                     stock sizing
=============  =========================================  ======  ============================  ======================
``est_att``    (steps, depth, 2, heads, T, 2*head_dim)    mel 50  prompt + last 100, newest 1st  buffer at 1000 frames
``est_cnn``    (steps, depth, 2, 2*hidden, 2)             -       fixed                         buffer (16, 16, ...)
``enc.att``    (blocks, 1, heads, T, 2*d_k)               mel 50  prompt + last 100             cat grow + truncate
``enc.cnn``    (1, C, 2 + 2*stride)                       -       fixed                         new tensors per call
``flow_noise`` (1, 80, N)                                  -       fixed N = prompt + 156         buffer of 30,000 frames
``spk_cond``   (2, 80)                                    -       fixed                         recomputed per call
``hift.mel``   (1, 80, 8) / ``hift.source`` (1, 1, 3840) / ``hift.speech`` (1, 3840)  fixed      new tensors per call
=============  =========================================  ======  ============================  ======================

``enc.*`` and ``hift.*`` are declared by the conformer encoder and the vocoder themselves (streaming
blocks, :meth:`UpsampleConformerEncoder.regions` / :meth:`HiFT.regions`) and mounted here under a prefix.

Noise offsets are the estimator cache's length before the step (the stock's rule), a per-signature
constant, so no device counter is needed; the HiFT draws use the device's default generator.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch import nn

from engine.core.graphs import example_randint
from engine.core import (STILL, Clock, Fixed, PrefixWindow, Region, SessionSpec, StateView, Static, StepPlan,
                         StreamingModel, prefixed)

from engine.fastpath import Verdict

from .config import CHUNK_TOKENS, LOOKAHEAD, MEL_CACHE, MEL_RATE, SILENCE_TOKEN, WINDOW, T2WConfig
from .flow import Flow
from .hift import HiFT

MEL = Clock("mel", (2 * CHUNK_TOKENS,), rate_hz=float(MEL_RATE))
NOISE_MARGIN = WINDOW + 2 * (CHUNK_TOKENS + LOOKAHEAD)      # the furthest any chunk reads past the prompt


class StepAudio2Token2Wav(StreamingModel):
    """The whole tail (flow + HiFT). Call :meth:`prepare` after moving it to its device."""

    name = "step-audio2"
    step_branches = ("last", "first")      # the last chunk reads no lookahead; the first fades in no overlap

    def __init__(self, cfg: T2WConfig):
        super().__init__()
        self.cfg = cfg
        self.flow = Flow(cfg.flow)
        self.hift = HiFT(cfg.hift)

    @torch.no_grad()
    def prepare(self) -> "StepAudio2Token2Wav":
        """Per-device constants: Euler schedule, adaLN modulations, folded weight norm."""
        self.flow.build_constants()
        self.hift.prepare()
        return self

    def check_fast_paths(self, prompt_frames: int, short_chunks: bool = False) -> List[Verdict]:
        """Run the start-up self-checks of the optional faster paths (:mod:`engine.fastpath`) for the lengths a
        stream meets from the start: the encoder's 25 and 50 Hz layers and the DiT over the prompt and over a
        chunk, the HiFT over the first chunk and over a chunk with its overlap. ``short_chunks``: also every
        length of a chunk shorter than a full one (:meth:`check_short_chunks`); otherwise such a chunk is
        checked when it comes. Returns every verdict."""
        chunk, up = MEL.pattern[0], self.flow.up_rate
        for t in sorted({prompt_frames // up, prompt_frames, chunk // up, chunk}):
            self.flow.encoder.fast(t)
        for t in sorted({prompt_frames, chunk}):
            self.flow.decoder.estimator.fast(t)
        for frames in (chunk, chunk + MEL_CACHE):
            self.hift.fast(frames)
        if short_chunks:
            self.check_short_chunks()
        return self.verdicts()

    def check_short_chunks(self) -> None:
        """The self-checks of every chunk of n = 1 .. 24 tokens: the encoder over its n tokens and their n * 2 mel
        frames, the DiT over the mel frames, the HiFT over them alone (a stream's first chunk) and with the
        carried-over frames. A backbone that cuts its tokens into short chunks (MiniCPM-o's duplex loop: any
        buffer of at least 8 tokens, and a turn's last chunk of any length) meets these lengths mid-session,
        where a first check runs its trials eagerly and captured inside that second (on the H200 a turn's last
        chunk took 390 ms of SPEAK that way)."""
        up = self.flow.up_rate
        for n in range(1, MEL.pattern[0] // up):
            mel = n * up
            self.flow.encoder.fast(n)
            self.flow.encoder.fast(mel)
            self.flow.decoder.estimator.fast(mel)
            self.hift.fast(mel)
            self.hift.fast(mel + MEL_CACHE)

    def use_reference_paths(self) -> "StepAudio2Token2Wav":
        """Run every optional faster path's reference (unchecked) from now on: the "before" of a bench."""
        for checked in (self.flow.encoder.checked, self.flow.decoder.estimator.checked, self.hift.checked):
            checked.clear()
            checked.reference_only = True
        return self

    def verdicts(self) -> List[Verdict]:
        """The faster paths' verdicts so far (encoder, DiT, then HiFT), for the session info."""
        return self.flow.encoder.verdicts() + self.flow.decoder.estimator.verdicts() + self.hift.verdicts()

    @property
    def device(self) -> torch.device:
        return self.hift.fade.device

    # -- session declaration -------------------------------------------------------------------------
    def spec(self, prompt_frames: int, steps: Optional[int] = None, last_tokens: Optional[int] = None,
                label: str = "") -> SessionSpec:
        """A session over a prompt of ``prompt_frames`` mel frames; ``last_tokens`` on the last chunk."""
        if prompt_frames <= 0 or prompt_frames % 2:
            raise ValueError(f"the prompt must be a positive, even number of mel frames, got {prompt_frames}")
        last = {} if last_tokens is None else {"mel": 2 * int(last_tokens)}
        return SessionSpec(steps=steps, prefix={"est_att": prompt_frames, "enc.att": prompt_frames},
                           last_advance=last, label=label or f"step-audio2, prompt {prompt_frames} frames")

    def regions(self, spec: SessionSpec) -> List[Region]:
        f, d = self.cfg.flow, self.cfg.flow.dit
        prompt = int(spec.prefix.get("est_att", 0))
        return prefixed("enc", self.flow.encoder.regions(MEL, PrefixWindow(WINDOW))) + [
            Region("est_att", (f.n_timesteps, d.depth, 2, d.heads, None, 2 * d.head_dim), MEL,
                   PrefixWindow(WINDOW), stock_shape=(16, 16, 2, 8, 1000, 128), newest_first=True,
                   stock_note="module buffer (16, 16, 2, 8, 1000, 128) + torch.cat truncation"),
            Region("est_cnn", (f.n_timesteps, d.depth, 2, 2 * d.hidden, 2), STILL, Static(),
                   stock_shape=(16, 16, 2, 1024, 2), stock_note="module buffer (16, 16, 2, 1024, 2)"),
            Region("flow_noise", (1, f.output_size, None), STILL, Fixed(prompt + NOISE_MARGIN),
                   stock_units=50 * 600, stock_note="module buffer for 600 s"),
            Region("spk_cond", (2, f.output_size), STILL, Static(), stock_note="recomputed every call"),
        ] + prefixed("hift", self.hift.regions(STILL))

    # -- prefill -------------------------------------------------------------------------------------
    @torch.no_grad()
    def init_state(self, state: StateView, prompt: Dict[str, torch.Tensor]) -> None:
        """Prompt prefill, as the stock's ``setup_cache``: fills both flows' caches over the prompt.

        ``prompt``: ``tokens`` (1, n) int, ``mel`` (1, 2n, 80), ``spk`` (1, 192), ``noise`` (1, 80, >= N).
        """
        tokens, mel, spk, noise = (prompt[k] for k in ("tokens", "mel", "spk", "noise"))
        n_noise = state["flow_noise"].get().shape[-1]
        state["flow_noise"].set(noise[:, :, :n_noise])
        spk2 = self.flow.speaker(spk)
        state["spk_cond"].set(spk2)
        pad = torch.full((1, LOOKAHEAD), SILENCE_TOKEN, dtype=tokens.dtype, device=tokens.device)
        tokens = torch.cat([tokens, pad], dim=1)
        if (tokens.shape[1] - LOOKAHEAD) * self.flow.up_rate != mel.shape[1]:
            raise ValueError(f"prompt mel has {mel.shape[1]} frames, expected 2 x {tokens.shape[1] - LOOKAHEAD}")
        mu = self.flow.encode(tokens, False, state.under("enc"), 0, True)
        self.flow.solve(mu, spk2, mel.transpose(1, 2).contiguous(), state["flow_noise"].get()[:, :, :mu.shape[2]],
                        state["est_att"].get(), state["est_cnn"].get())

    # -- one chunk -------------------------------------------------------------------------------------
    def example_inputs(self, plan: StepPlan, device) -> Dict[str, torch.Tensor]:
        n = self.chunk_tokens(plan)
        return {"tokens": example_randint(self.cfg.flow.vocab_size, (1, n), device)}

    def chunk_tokens(self, plan: StepPlan) -> int:
        """Tokens the step consumes: 25 + 3 lookahead, or all remaining on the last chunk."""
        frames = plan.advances["mel"]
        return frames // self.flow.up_rate if plan.is_last else frames // self.flow.up_rate + LOOKAHEAD

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        tokens = inputs["tokens"]
        last, first = plan.is_last, plan.index == 0
        before = plan.before["est_att"]
        mu = self.flow.encode(tokens, last, state.under("enc"), plan.before["enc.att"], False)
        est_att = state["est_att"].grow()
        t = mu.shape[2]
        noise = state["flow_noise"].get()[:, :, before:before + t]
        mel = self.flow.solve(mu, state["spk_cond"].get(), None, noise, est_att, state["est_cnn"].get())
        return {"audio": self.vocode(state, mel, first, last)}

    def vocode(self, state: StateView, chunk_mel: torch.Tensor, first: bool, last: bool) -> torch.Tensor:
        """HiFT with the 8-frame overlap and the cross-fade; returns the audio that is final now."""
        return self.hift.stream(state.under("hift"), chunk_mel, first, last)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
