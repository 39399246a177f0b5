"""The embedded default backbone: a voice-activity duplex policy and a real AR speech-token decoder.

Honest about what it is: the decoder (:mod:`engine.backbones.speech_decoder`) has seeded random
weights, so its tokens are not speech — but it runs the same work as a released duplex model's TTS stage
at the released size, so the timing and the memory are real.

Per second:
* LISTEN — a voice-activity decision (:class:`~engine.vad.EnergyVAD`, done by the session)
  and the second's audio as 10 embeddings (log-mel of ten 100 ms windows, projected to the
  decoder width; a stand-in for a duplex model's 10 audio tokens per second) prefilled into the decoder,
  one engine step each, so the decoder's context holds what the user said;
* THINK — the :class:`~engine.vad.TurnPolicy` decides; when it speaks, the decoder
  generates the second's frames plus one boundary token (25 + 1 for Step-Audio2), one step each.
Every step runs through the engine's :class:`~engine.core.executor.Executor`, so the toggles
(demand-sized state, graph replay) apply here too without changing a token.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, Optional

import torch
from torch import nn

from engine.audio import SESSION_RATE
from engine.core import Executor, make_plan
from engine.core.toggles import Toggles

from engine.backbones.policy import SPEAK, TurnPolicy
from engine.backbones.base import Backbone, BackboneInfo, Thought, TokenFormat
from engine.backbones.speech_decoder import SpeechDecoder, decoder_args

if TYPE_CHECKING:
    from engine.vad import VadResult

AUDIO_TOKENS_PER_SECOND = 10
N_MELS = 80


def mel_filterbank(n_bins: int, n_mels: int, rate: int, fmin: float = 0.0, fmax: Optional[float] = None):
    """Triangular mel filters (HTK mel scale): [n_bins, n_mels] float32."""
    fmax = fmax or rate / 2.0
    mel = lambda f: 2595.0 * math.log10(1.0 + f / 700.0)           # noqa: E731
    pts = torch.linspace(mel(fmin), mel(fmax), n_mels + 2, dtype=torch.float64)
    hz = 700.0 * (10.0 ** (pts / 2595.0) - 1.0)                     # [n_mels + 2]
    freqs = torch.linspace(0.0, rate / 2.0, n_bins, dtype=torch.float64)   # [n_bins]
    lo, mid, hi = hz[:-2], hz[1:-1], hz[2:]
    up = (freqs[:, None] - lo[None]) / (mid - lo)[None]
    down = (hi[None] - freqs[:, None]) / (hi - mid)[None]
    return torch.clamp(torch.minimum(up, down), min=0.0).to(torch.float32)


class AudioEmbedder(nn.Module):
    """One second of 24 kHz audio -> 10 embeddings: log-mel of 100 ms Hann windows, projected."""

    def __init__(self, dim: int, rate: int = SESSION_RATE, seed: int = 0):
        super().__init__()
        self.win = rate // AUDIO_TOKENS_PER_SECOND
        self.register_buffer("window", torch.hann_window(self.win, periodic=True), persistent=False)
        self.register_buffer("fbank", mel_filterbank(self.win // 2 + 1, N_MELS, rate), persistent=False)
        self.proj = nn.Linear(N_MELS, dim)
        g = torch.Generator().manual_seed(int(seed) + 1)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(self.proj.weight.shape, generator=g) * 0.05)
            self.proj.bias.zero_()

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        # audio: [samples] (a whole number of 100 ms windows) -> [n, 1, 1, dim]
        w = audio.view(-1, self.win) * self.window                 # [n, win]
        power = torch.fft.rfft(w, dim=-1).abs().pow(2)              # [n, win/2+1]
        logmel = torch.log(power @ self.fbank + 1e-6)               # [n, 80]
        return self.proj(logmel).view(-1, 1, 1, self.proj.out_features)


class SyntheticBackbone(Backbone):
    """VAD-driven duplex policy + the seeded-random AR speech decoder on the engine executor."""

    def __init__(self, fmt: TokenFormat, *, size: str, device, seed: int = 0, demand_sized: bool = True,
                 graph_replay: bool = True, reply_seconds: int = 4, debug: bool = False,
                 shared: Optional[Dict[str, object]] = None):
        self.fmt = fmt
        self._shared = shared
        self.size = size
        self.device = torch.device(device)
        self.seed = int(seed)
        self.args = decoder_args(size, fmt.vocab, fmt.codebooks)
        self.policy = TurnPolicy(reply_seconds)
        self._toggles = Toggles(bool(demand_sized), bool(graph_replay))
        self.debug = debug
        self.model: Optional[SpeechDecoder] = None
        self.executor: Optional[Executor] = None
        a = self.args
        self.info = BackboneInfo(
            name="synthetic",
            title=(f"synthetic duplex backbone (VAD policy + AR speech decoder, Llama {a.dim}x{a.n_layers}, "
                   f"{a.n_heads} heads, FFN {a.ffn}, {size}; seeded random weights)"),
            synthetic=True,
            note="seeded random weights: timing and memory are real, the voice is not speech")

    def start(self) -> None:
        with torch.no_grad():
            if self._shared is not None:                 # another session's weights (read-only when stepping)
                self.embedder, self.model = self._shared["embedder"], self._shared["model"]
            else:
                model = SpeechDecoder(self.args, seed=self.seed)
                self.embedder = AudioEmbedder(self.args.dim, seed=self.seed).to(self.device).eval()
                self.model = model.to(self.device).eval()
            spec = self.model.session_spec()
            plan = make_plan(self.model.regions(spec), spec)
            self.executor = Executor(self.model, plan, self.device, debug=self.debug, **self._toggles)
            self.executor.prepare_graphs(lambda sp: self.model.example_inputs(sp, self.device))
            self.executor.init_state({})

    # -- per second --------------------------------------------------------------------------------
    def listen(self, audio: torch.Tensor, vad: VadResult) -> None:
        emb = self.listen_inputs(audio, vad)                        # [10, 1, 1, dim]
        with torch.no_grad():
            for i in range(emb.shape[0]):
                self.executor.step({"x": emb[i]})

    def listen_inputs(self, audio: torch.Tensor, vad: VadResult) -> torch.Tensor:
        """LISTEN's decoder inputs for one second, [10, 1, 1, dim] (the voice activity is noted for
        THINK); :meth:`listen` steps them one by one, a host may step several sessions' together."""
        self._speech = bool(vad.speech)
        with torch.no_grad():
            return self.embedder(audio)

    def think(self, frames: int) -> Thought:
        decision = self.policy.decide(self._speech)
        if decision != SPEAK:
            return Thought(decision, None, 0)
        toks = []
        with torch.no_grad():
            x = self.model.bos.detach()
            for _ in range(frames + 1):                             # the frames, then one boundary token
                out = self.executor.step({"x": x})
                toks.append(out["tok"])                             # [K]
                x = out["next"]                                     # [1, 1, dim]
        tokens = torch.stack(toks[:frames], dim=1)                  # [K, frames] int64, on the device
        return Thought(decision, tokens, frames * self.fmt.codebooks)

    # -- toggles and reporting -----------------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        self._toggles = toggles
        if self.executor is not None:
            self.executor.set_toggles(toggles)

    def toggles(self) -> Toggles:
        return self.executor.toggles() if self.executor is not None else self._toggles.effective(self.device)

    def state_bytes(self) -> int:
        return self.executor.state_bytes() if self.executor is not None else 0

    def shared_weights(self) -> Optional[Dict[str, object]]:
        if self.model is None:
            return None
        return {"model": self.model, "embedder": self.embedder}

    def close(self) -> None:
        self.executor = None
        self.model = None
