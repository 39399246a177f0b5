"""One streamed Step-Audio2 session on the engine: chunk schedule, modes, seeding, the executor.

The schedule is the stock ``Token2wav.stream`` feeding rule: chunk ``i`` is ``tokens[25i : 25i+28]``
(25 new + 3 lookahead); the first chunk with ``25i + 28 >= len(tokens)`` is the last one, takes every
remaining token and runs with ``last_chunk=True``.

Modes (all three give the same bits):
* ``stock``   – state kept the stock way: static buffers at the stock constants, cat grow/truncate;
* ``demand``  – every region allocated once at its planner demand size, retention in place;
* ``graphs``  – demand-sized, plus one CUDA graph per multi-use shape signature, captured before prefill.

Randomness: the flow noise is ``randn(1, 80, 30000)`` from ``torch.Generator().manual_seed(seed)`` on the
CPU (then moved), and the default generators are seeded once with ``torch.manual_seed(seed)`` at stream
start, so the HiFT draws come in the stock's order from the same state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from engine.core import Executor, Plan, make_plan
from engine.core.toggles import MODES, Toggles  # noqa: F401  (MODES: the mode names, re-exported)

from .config import CHUNK_TOKENS, LOOKAHEAD
from .model import StepAudio2Token2Wav

NOISE_FRAMES = 50 * 600


def schedule(n_tokens: int) -> List[Tuple[int, int, bool]]:
    """(start, count, last) per chunk for a token sequence of ``n_tokens`` (the stock feeding rule)."""
    if n_tokens <= 0:
        raise ValueError("no speech tokens to decode")
    out, i, span = [], 0, CHUNK_TOKENS + LOOKAHEAD
    while True:
        start = CHUNK_TOKENS * i
        if start + span >= n_tokens:
            out.append((start, n_tokens - start, True))
            return out
        out.append((start, span, False))
        i += 1


def flow_noise(seed: int) -> torch.Tensor:
    """The flow's noise table: a CPU generator seeded with ``seed`` (the same table for ours and the stock)."""
    return torch.randn(1, 80, NOISE_FRAMES, generator=torch.Generator().manual_seed(int(seed)))


def mode_flags(mode: str) -> Dict[str, bool]:
    return dict(Toggles.from_mode(mode))


@dataclass
class Prompt:
    """A voice prompt: 25 Hz tokens, the matching 50 Hz mel (2 frames a token) and the x-vector."""

    tokens: torch.Tensor      # (1, n) int64
    mel: torch.Tensor         # (1, 2n, 80) float32
    spk: torch.Tensor         # (1, 192) float32

    @property
    def frames(self) -> int:
        return int(self.mel.shape[1])

    def to(self, device) -> "Prompt":
        return Prompt(self.tokens.to(device), self.mel.to(device), self.spk.to(device))


def fit_mel(tokens: torch.Tensor, mel: torch.Tensor) -> torch.Tensor:
    """(1, frames, 80) -> (1, 2n, 80): replicate-pad or cut, as the stock's ``_prepare_prompt``."""
    want = 2 * tokens.shape[1]
    have = mel.shape[1]
    if have < want:
        return torch.nn.functional.pad(mel, (0, 0, 0, want - have), mode="replicate")
    return mel[:, :want].contiguous()


def make_prompt(tokens, mel, spk, vocab: int = 6561, source: str = "prompt") -> Prompt:
    """A checked :class:`Prompt` from arrays (an .npz's, or the ONNX front-end's); ValueError naming ``source``."""
    tokens = torch.as_tensor(np.asarray(tokens)).reshape(1, -1)
    mel = torch.as_tensor(np.asarray(mel, dtype=np.float32))
    spk = torch.as_tensor(np.asarray(spk, dtype=np.float32)).reshape(1, -1)
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"{source}: prompt_tokens must be integers")
    tokens = tokens.long()
    if tokens.shape[1] == 0:
        raise ValueError(f"{source}: prompt_tokens is empty")
    if tokens.min() < 0 or tokens.max() >= vocab:
        raise ValueError(f"{source}: prompt_tokens must be in [0, {vocab})")
    if mel.dim() != 2 or mel.shape[1] != 80 or mel.shape[0] == 0:
        raise ValueError(f"{source}: prompt_mel must be (frames, 80), got {tuple(mel.shape)}")
    if spk.shape[1] != 192:
        raise ValueError(f"{source}: speaker_embedding must have 192 values, got {spk.shape[1]}")
    if not (torch.isfinite(mel).all() and torch.isfinite(spk).all()):
        raise ValueError(f"{source}: prompt_mel / speaker_embedding contain NaN or inf")
    return Prompt(tokens, fit_mel(tokens, mel.unsqueeze(0)), spk)


class Session:
    """Runs chunks of one stream; ``steps=None`` is an open-ended live session (see :meth:`finish`)."""

    def __init__(self, model: StepAudio2Token2Wav, prompt: Prompt, steps: Optional[int] = None,
                 last_tokens: Optional[int] = None, mode: str = "graphs", seed: int = 0, debug: bool = False):
        self.model = model
        self.device = model.device
        if self.device.type == "cuda":
            # the HiFT's transposed convs may otherwise get atomics-based cuDNN algorithms, which do not
            # repeat their own bits (measured: 1.5e-2 between two identical stock calls): every mode must
            # give the same bits, so cuDNN is held to deterministic algorithms (a process-wide setting)
            torch.backends.cudnn.deterministic = True
        self.prompt = prompt.to(self.device)
        self.mode = mode
        self.seed = int(seed)
        flags = mode_flags(mode)
        spec = model.spec(self.prompt.frames, steps, last_tokens)
        self.plan: Plan = make_plan(model.regions(spec), spec)
        self.executor = Executor(model, self.plan, self.device, debug=debug, **flags)
        self.fast_paths = model.check_fast_paths(self.prompt.frames)      # before any capture
        self.graphs = self.executor.prepare_graphs(lambda sp: model.example_inputs(sp, self.device))
        torch.manual_seed(self.seed)
        noise = flow_noise(self.seed).to(self.device)
        self.executor.init_state({"tokens": self.prompt.tokens, "mel": self.prompt.mel, "spk": self.prompt.spk,
                                  "noise": noise})

    @property
    def k(self) -> int:
        return self.executor.k

    def run(self, tokens: Sequence[int]) -> torch.Tensor:
        """Decode the next chunk's tokens; returns the chunk's final audio ``(1, n)`` on the device."""
        sp = self.plan.step(self.k)
        want = self.model.chunk_tokens(sp)
        if len(tokens) != want:
            raise ValueError(f"chunk {self.k} takes {want} tokens, got {len(tokens)}")
        t = torch.as_tensor(np.asarray(tokens, dtype=np.int64)).reshape(1, -1).to(self.device)
        return self.executor.step({"tokens": t})["audio"]

    def finish(self, tokens: Sequence[int]) -> torch.Tensor:
        """Last chunk of an open-ended session: a finite plan for the steps so far + this one, the state
        migrated into its arena (exact copies), run eagerly."""
        k, old = self.k, self.executor
        spec = self.model.spec(self.prompt.frames, k + 1, len(tokens))
        self.plan = make_plan(self.model.regions(spec), spec)
        ex = Executor(self.model, self.plan, self.device, demand_sized=old.arena.kind == "demand")
        ex.arena.load(old.arena.export(), dict(old.arena.positions), k)
        ex.k = k
        self.executor = ex
        return self.run(tokens)

    def state_bytes(self) -> int:
        return self.executor.state_bytes()


def synthesize(model: StepAudio2Token2Wav, prompt: Prompt, tokens: Sequence[int], mode: str = "graphs",
               seed: int = 0) -> List[np.ndarray]:
    """Every chunk's float32 audio for a whole token sequence (the synth command's core)."""
    sched = schedule(len(tokens))
    sess = Session(model, prompt, len(sched), sched[-1][1], mode, seed)
    out = []
    for start, n, _ in sched:
        out.append(sess.run(tokens[start:start + n]).float().cpu().numpy().reshape(-1))
    return out
