"""LISTEN's first half: one second of microphone audio -> 10 LLM-width audio tokens.

1. 24 kHz input (the session's frames) is taken to 16 kHz by :class:`FirResampler` (a two-phase
   windowed-sinc FIR, its input history kept across seconds); 16 kHz input (the stock's) goes on as is;
2. the stock's streaming log-mel (:mod:`.mel`, its own engine model): 104 frames a second (the second's
   100 with 2 frames of context each side), 102 on the first second (no left context);
3. this engine :class:`~engine.core.model.StreamingModel`, one step per second: the Whisper encoder's
   conv(k3) + GELU, conv(k3, stride 2) + GELU -> 52 positions, the two edge positions dropped -> 50 (the
   first second: 51, the last dropped); learned positions from where the encoder's cache stands; 24
   pre-norm layers attending over the cache plus the new 50 (keys/values are regions); final LayerNorm;
4. projector (1024 -> 4096, ReLU, 4096 -> 4096) and AvgPool(5): 10 tokens.

The stock keeps growing the encoder's key/value cache and drops it when it would reach the encoder's
1,500 positions; :class:`ResetWindow` declares exactly that, so the planner knows every second's shape
(a period of 29 seconds at the released size) and each recurs: one CUDA graph per signature.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from engine import fastpath
from engine.core.graphs import example_randn
from engine.core import (Clock, Executor, Region, Retention, SessionSpec, SlidingWindow, StateView, StepPlan,
                         StreamingModel, make_plan)
from engine.core.toggles import Toggles

from .dims import AudioDims
from .layers import Projector
from .mel import FRAMES as MEL_FRAMES, HOP, RATE, WIN, StreamingLogMel

RATE_IN = 24000                   # the session's frames
N_FFT = WIN
POSITIONS = MEL_FRAMES // 2       # encoder positions per second
TAPS = 48                         # resampler FIR length (per phase)
RS_HISTORY = TAPS - 3             # 24 kHz samples kept between seconds


@dataclass(frozen=True)
class ResetWindow(SlidingWindow):
    """Grows by ``advance`` a step and starts again from empty once it would reach ``window``.

    The stock's encoder cache: when ``cache + advance >= window`` before a second, the cache is
    dropped and the second starts a fresh one. After a step whose view held ``grown`` units, the
    region keeps ``grown`` unless the next step would overflow, in which case it keeps nothing.
    """

    advance: int = POSITIONS
    kind = "reset-window"

    def initial(self, prefix: int) -> int:
        return 0

    def after(self, grown: int, prefix: int) -> int:
        return 0 if grown + self.advance >= self.window else grown

    def describe(self) -> str:
        return f"grow, reset before {self.window}"


@dataclass(frozen=True)
class Begun(Retention):
    """One unit once the stream has begun: the first step reads 0 -> 1, every later one 1 -> 2, so the
    first second (framed apart: no left context) has a signature of its own."""

    kind = "begun"

    def initial(self, prefix: int) -> int:
        return 0

    def after(self, grown: int, prefix: int) -> int:
        return 1

    def describe(self) -> str:
        return "begun"


class FirResampler:
    """24 kHz -> 16 kHz, one second at a time: [24000] -> [16000] float32, its 45-sample input history kept
    (allocated once, updated in place)."""

    def __init__(self, device):
        self.kernels = resampler_kernels().to(device)
        self.history = torch.zeros(RS_HISTORY, device=device)

    def __call__(self, pcm: torch.Tensor) -> torch.Tensor:
        ext = torch.cat([self.history, pcm.to(torch.float32)])                        # [45 + 24000]
        self.history.copy_(ext[-RS_HISTORY:])
        y = F.conv1d(ext.view(1, 1, -1), self.kernels, stride=3)                     # [1, 2, 8000]
        return y[0].transpose(0, 1).reshape(-1)                                      # [16000]


class FrontEnd:
    """One second of input -> the stock's log-mel frames for the encoder ([n_mels, 104]; 102 the first).

    The input contract: one second of mono float32, either at 16 kHz (16,000 samples: the samples the stock
    receives, taken as they are, so the features are the stock's bit for bit) or at 24 kHz (24,000 samples:
    the session's frames, taken to 16 kHz by :class:`FirResampler` first). The first second fixes the rate.
    The log-mel runs on its own executor (state in the arena the toggles choose; eager, no CUDA graphs) on the
    CPU, whatever the session's device, as the stock's processor computes its features on the CPU before they
    go to the model's device (a CUDA STFT and mel product round differently: features 1e-6 apart, measured on
    the H200); the features [n_mels, frames] are then moved to ``device``."""

    def __init__(self, fbank: torch.Tensor, window: torch.Tensor, device, demand_sized: bool):
        cpu = torch.device("cpu")
        self.device = torch.device(device)
        self.mel = StreamingLogMel(fbank.to(cpu), window.to(cpu))
        spec = self.mel.session_spec()
        self.executor = Executor(self.mel, make_plan(self.mel.regions(spec), spec), cpu,
                                 demand_sized=demand_sized, graph_replay=False)
        self.executor.init_state({})
        self.resampler = FirResampler(cpu)
        self.rate: Optional[int] = None
        # torch's intra-op threads for the CPU work (None: the process's); 1 where the start-up check proved the
        # same bits (check_one_thread): on a CUDA session the threads sleep between seconds, and waking them made
        # the H200 host's 16-thread front end take up to 64 ms after an idle gap, against 2.8 ms on one thread
        self.threads: Optional[int] = None

    def __call__(self, audio: torch.Tensor) -> torch.Tensor:
        rate = {RATE: RATE, RATE_IN: RATE_IN}.get(int(audio.shape[-1])) if audio.dim() == 1 else None
        if rate is None:
            raise ValueError(f"minicpm-o-4.5 listens to one second of mono audio at 16 kHz ({RATE} samples) or "
                             f"24 kHz ({RATE_IN}); got shape {tuple(audio.shape)}")
        if self.rate is not None and rate != self.rate:
            raise ValueError(f"this session's audio is at {self.rate} Hz; a second at {rate} Hz cannot follow it")
        self.rate = rate
        audio = audio.to("cpu", torch.float32)
        with intra_op_threads(self.threads):
            pcm = audio if rate == RATE else self.resampler(audio)
            features = self.executor.step({"pcm": pcm})["features"]
        return features.to(self.device)

    def set_toggles(self, toggles: Toggles) -> None:
        self.executor.set_toggles(Toggles(toggles.demand_sized, False))

    def state_bytes(self) -> int:
        return int(self.executor.state_bytes()) + self.resampler.history.numel() * 4


def warm_front_end(fbank: torch.Tensor, window: torch.Tensor, device) -> None:
    """The CPU log-mel's first calls in a process, made at start on throwaway front ends (no session state
    moves). The first call plans its FFTs and wakes its threads: 95 ms, then 8.6 ms, then 0.8 ms on the H200
    host's CPU. A CUDA session computes no other mel on the CPU before its first second, so that second paid it: 147 ms
    of LISTEN against ~30 (H200). Both input rates, a few seconds each, from a private generator."""
    g = torch.Generator().manual_seed(0)
    for rate, calls in ((RATE_IN, 3), (RATE, 2)):
        front = FrontEnd(fbank, window, device, demand_sized=True)
        for _ in range(calls):
            front(torch.randn(rate, generator=g) * 0.1)


@contextlib.contextmanager
def intra_op_threads(n: Optional[int]) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` while the block runs (None: left as it is)."""
    was = torch.get_num_threads()
    if n is None or n == was:
        yield
        return
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(was)


def check_one_thread(fbank: torch.Tensor, window: torch.Tensor, seconds: int = 4) -> fastpath.Verdict:
    """The start-up self-check (:func:`engine.fastpath.self_check`: cached, overridden by ``--reference-paths``)
    of the front end on one thread against the process's threads: fresh front ends fed the same random seconds
    at both input rates (the resampler, the FFT, the mel product), every feature compared bit for bit (torch
    promises no thread-count independence)."""
    threads = torch.get_num_threads()

    def trial(on: bool) -> List[torch.Tensor]:
        g, out = torch.Generator().manual_seed(5), []
        for rate in (RATE_IN, RATE):
            front = FrontEnd(fbank, window, "cpu", demand_sized=True)
            front.threads = 1 if on else None
            out += [front(torch.randn(rate, generator=g) * (0.3 if k % 2 else 0.02)) for k in range(seconds)]
        return out
    return fastpath.self_check("front end on one thread", "cpu", ("threads", threads, seconds, tuple(fbank.shape)),
                               trial, not_applicable="the process runs one thread" if threads == 1 else None)


def resampler_kernels(taps: int = TAPS, cutoff: float = 0.3) -> torch.Tensor:
    """Two FIR phases [2, 1, taps] taking 24 kHz to 16 kHz (outputs at 1.5-sample input steps)."""
    n = torch.arange(taps, dtype=torch.float64)
    centre = (taps - 1) / 2.0 - 0.75
    kernels = []
    for shift in (0.0, 1.5):
        t = n - centre - shift
        h = 2 * cutoff * torch.sinc(2 * cutoff * t)
        h = h * (0.5 - 0.5 * torch.cos(2 * math.pi * (n + 0.5) / taps))    # Hann over the taps
        kernels.append(h / h.sum())
    return torch.stack(kernels).unsqueeze(1).to(torch.float32)


def slaney_mel(n_mels: int = 80, n_fft: int = N_FFT, rate: int = RATE) -> torch.Tensor:
    """Slaney-scale, area-normalised triangular mel filters: [n_fft/2 + 1, n_mels] float32."""
    def to_mel(f):
        f = torch.as_tensor(f, dtype=torch.float64)
        lin = 3.0 * f / 200.0
        return torch.where(f < 1000.0, lin, 15.0 + 27.0 * torch.log(torch.clamp(f, min=1e-9) / 1000.0) / math.log(6.4))

    def to_hz(m):
        lin = 200.0 * m / 3.0
        return torch.where(m < 15.0, lin, 1000.0 * torch.exp((m - 15.0) * math.log(6.4) / 27.0))

    pts = to_hz(torch.linspace(0.0, float(to_mel(rate / 2.0)), n_mels + 2, dtype=torch.float64))   # [n_mels + 2]
    freqs = torch.linspace(0.0, rate / 2.0, n_fft // 2 + 1, dtype=torch.float64)                  # [bins]
    lo, mid, hi = pts[:-2], pts[1:-1], pts[2:]
    up = (freqs[:, None] - lo[None]) / (mid - lo)[None]
    down = (hi[None] - freqs[:, None]) / (hi - mid)[None]
    w = torch.clamp(torch.minimum(up, down), min=0.0) * (2.0 / (hi - lo))[None]
    return w.to(torch.float32)


class EncoderLayer(nn.Module):
    """Whisper encoder layer (pre-LayerNorm attention with biases but none on keys; GELU MLP)."""

    def __init__(self, a: AudioDims):
        super().__init__()
        d = a.d_model
        self.h, self.hd = a.heads, a.head_dim
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(d, d)
        self.self_attn.k_proj = nn.Linear(d, d, bias=False)
        self.self_attn.v_proj = nn.Linear(d, d)
        self.self_attn.out_proj = nn.Linear(d, d)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=a.eps)
        self.fc1 = nn.Linear(d, a.ffn)
        self.fc2 = nn.Linear(a.ffn, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=a.eps)

    def forward(self, x: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor,
                k_new: torch.Tensor, v_new: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        # x: [1, T, d]; k_all/v_all: [H, L, hd] (history + these T, written through k_new/v_new [H, T, hd]);
        # mask: an additive [1, 1, T, L] attention mask (the reference clip's chunk mask, ref_audio.py) or None
        t = x.shape[1]
        att = self.self_attn
        h = self.self_attn_layer_norm(x)
        q = att.q_proj(h).view(1, t, self.h, self.hd).transpose(1, 2)              # [1, H, T, hd]
        k_new.copy_(att.k_proj(h).view(t, self.h, self.hd).transpose(0, 1))
        v_new.copy_(att.v_proj(h).view(t, self.h, self.hd).transpose(0, 1))
        # contiguous, as the stock's Whisper attention hands them to SDPA
        o = F.scaled_dot_product_attention(q.contiguous(), k_all.unsqueeze(0).contiguous(),
                                           v_all.unsqueeze(0).contiguous(), attn_mask=mask)   # [1, H, T, hd]
        x = x + att.out_proj(o.transpose(1, 2).reshape(1, t, -1))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(StreamingModel):
    """Streaming Whisper encoder + projector + pooling, one engine step per second of audio.

    Step input ``features``: [n_mels, 104] float32 log-mel (:mod:`.mel`; [n_mels, 102] on the first
    second); output ``emb``: [10, llm_hidden] in the model dtype.
    Parameter names follow the checkpoint (``conv1``, ``conv2``, ``embed_positions``, ``layers.N``,
    ``layer_norm``; the projector is ``proj.linear1/2``, stored as ``audio_projection_layer``).
    """

    name = "minicpmo45-audio"

    def __init__(self, a: AudioDims, llm_hidden: int):
        super().__init__()
        self.a = a
        self.conv1 = nn.Conv1d(a.n_mels, a.d_model, 3, padding=1)
        self.conv2 = nn.Conv1d(a.d_model, a.d_model, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(a.max_positions, a.d_model)
        self.layers = nn.ModuleList(EncoderLayer(a) for _ in range(a.layers))
        self.layer_norm = nn.LayerNorm(a.d_model, eps=a.eps)
        self.proj = Projector(a.d_model, llm_hidden)
        self.float_buffers(torch.device("cpu"))
        self.clock = Clock("encoder", (POSITIONS,), rate_hz=float(POSITIONS))
        self.audio_clock = Clock("seconds", (1,), rate_hz=1.0)

    def float_buffers(self, device) -> None:
        """(Re)make the float32 constants (Hann window, mel filters) on ``device``; call after casting the
        parameters to another dtype."""
        self.register_buffer("window", torch.hann_window(WIN, periodic=True).to(device), persistent=False)
        self.register_buffer("fbank", slaney_mel(self.a.n_mels).to(device), persistent=False)

    # -- engine contract ---------------------------------------------------------------------------
    def regions(self, spec: SessionSpec) -> List[Region]:
        a = self.a
        dt = self.conv1.weight.dtype
        shape = (a.layers, a.heads, None, a.head_dim)
        ret = ResetWindow(a.max_positions, POSITIONS)
        note = "HF past_key_values grown by torch.cat each second, dropped before reaching max positions"
        return [
            Region("begun", (None,), self.audio_clock, Begun(), dtype=torch.uint8,
                   stock_note="audio_chunk_idx == 0", doc="whether the stream has begun (first-second framing)"),
            Region("enc_k", shape, self.clock, ret, dtype=dt, stock_note=note, doc="encoder keys"),
            Region("enc_v", shape, self.clock, ret, dtype=dt, stock_note=note, doc="encoder values"),
        ]

    def session_spec(self) -> SessionSpec:
        return SessionSpec(steps=None, label="MiniCPM-o 4.5 audio encoder")

    def example_inputs(self, plan: StepPlan, device) -> Dict[str, torch.Tensor]:
        frames = MEL_FRAMES + 2 * (2 if plan.before["begun"] else 1)
        return {"features": example_randn((self.a.n_mels, frames), device) * 0.1}

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        mel = inputs["features"]                                     # [80, 104] float32 ([80, 102] first)
        state["begun"].tail().fill_(1)
        x = self._front(mel.to(self.conv1.weight.dtype), plan.before["begun"] == 0)   # [1, 50, d]
        before = plan.before["enc_k"]                                # host int, fixed per signature
        x = x + self.embed_positions.weight[before:before + POSITIONS].unsqueeze(0)
        k_all, v_all = state["enc_k"].grow(), state["enc_v"].grow()  # [L, H, before + 50, hd]
        k_new, v_new = state["enc_k"].tail(), state["enc_v"].tail()  # [L, H, 50, hd]
        # the stock's all-zero additive mask (full attention over history and the new positions): with a mask
        # SDPA takes its memory-efficient kernel, without one flash, and on CUDA they round differently
        # (equal up to 128 keys, apart beyond: measured on the H200 against the stock loop)
        mask = torch.zeros(1, 1, POSITIONS, k_all.shape[2], dtype=x.dtype, device=x.device)
        for i, layer in enumerate(self.layers):
            x = layer(x, k_all[i], v_all[i], k_new[i], v_new[i], mask)
        x = self.proj(self.layer_norm(x))                            # [1, 50, llm]
        emb = F.avg_pool1d(x.transpose(1, 2), self.a.pool, self.a.pool).transpose(1, 2)   # [1, 10, llm]
        return {"emb": emb[0]}

    # -- pieces --------------------------------------------------------------------------------------
    def _front(self, mel: torch.Tensor, first: bool) -> torch.Tensor:
        h = F.gelu(self.conv1(mel.unsqueeze(0)))                                     # [1, d, 104]
        h = F.gelu(self.conv2(h))                                                    # [1, d, 52] (51 first)
        return h[:, :, (0 if first else 1):-1].transpose(1, 2)                       # [1, 50, d]
