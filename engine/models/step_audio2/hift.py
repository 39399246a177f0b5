"""HiFT vocoder (HiFTNet: neural source filter + iSTFTNet), 80-bin mel at 50 Hz -> 24 kHz.

mel -> F0 predictor -> NSF excitation (x480) -> its STFT (n_fft 16, hop 4) feeds every upsampling stage;
mel -> conv_pre -> 3 x (leaky ReLU, transposed conv x8/x5/x3, + downsampled source, 3 Snake res-blocks)
-> conv_post -> magnitude/phase -> iSTFT -> clamp. Streaming is handled by the caller: the first 3,840
source samples are replaced by the previous chunk's (the 8-frame mel overlap).

On CUDA the inverse STFT is written out (irfft, window, overlap-add by ``unfold_backward``, divide by the window
envelope): the same ops ``torch.istft`` runs, without its host-side NOLA check, which a CUDA graph cannot hold.
The envelope only depends on the frame count, so it is built (and checked) once per shape, before any capture.
On the CPU, where nothing is captured, it is ``torch.istft`` itself, called as the stock calls it.

As a streaming block the vocoder declares its own overlap state (:meth:`HiFT.regions`, short names
``mel`` / ``source`` / ``speech``, mounted under a prefix by the decoder that holds it) and runs one
chunk over those handles (:meth:`HiFT.stream`): any decoder that emits 50 Hz mel chunks can hold it.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.core import STILL, Clock, Fixed, Region
from engine.fastpath import Verdict

from .config import MEL_CACHE, SOURCE_CACHE, HiFTConfig
from . import fused as fused_kernels
from .checked import CheckedPaths, streams_only
from .fused import available as fused_available
from .fused import worth_it as fused_worth_it
from .hift_parts import F0Predictor, ResBlock, SineSource, WNConv, fold_all
from .lanes import Forked, fork, parallel


#: the vocoder's optional faster paths, each enabled per mel length by a start-up self-check
FAST_PATHS = ("parallel lanes", "fused elementwise")


def _not_applicable(path: str, device: torch.device) -> Optional[str]:
    return fused_available(device) if path == "fused elementwise" else streams_only(path, device)


def captured_only(path: str) -> bool:
    """Whether ``path`` runs only while a CUDA graph is captured (the fused kernel, unless ``fused.EAGER``:
    :func:`.fused.worth_it`): then it is checked, and reported, as such."""
    return path == "fused elementwise" and not fused_kernels.EAGER


def hann_periodic(n: int) -> torch.Tensor:
    """scipy.signal.get_window('hann', n, fftbins=True) in float32 (a general cosine over n + 1 points)."""
    fac = np.linspace(-np.pi, np.pi, n + 1)
    w = np.zeros(n + 1)
    for k, a in enumerate((0.5, 0.5)):
        w += a * np.cos(k * fac)
    return torch.from_numpy(w[:-1].astype(np.float32))


class HiFT(nn.Module):
    """The generator; call :meth:`prepare` on the final device before :meth:`forward`."""

    def __init__(self, cfg: HiFTConfig):
        super().__init__()
        self.cfg = cfg
        rates, kernels = cfg.upsample_rates, cfg.upsample_kernel_sizes
        self.upp = int(np.prod(rates)) * cfg.hop_len            # samples per mel frame (480)
        base = cfg.base_channels
        self.m_source = SineSource(cfg.sampling_rate, self.upp, cfg.nb_harmonics, cfg.nsf_alpha, cfg.nsf_sigma,
                                   cfg.nsf_voiced_threshold)
        self.conv_pre = WNConv(cfg.in_channels, base, 7, 1, 3)
        self.ups = nn.ModuleList(
            WNConv(base // 2 ** i, base // 2 ** (i + 1), k, u, (k - u) // 2, transpose=True)
            for i, (u, k) in enumerate(zip(rates, kernels)))
        down = np.cumprod([1] + list(rates[::-1][:-1]))[::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        nf = cfg.n_fft + 2
        for i, (u, k, d) in enumerate(zip(down, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
            ch = base // 2 ** (i + 1)
            u = int(u)
            self.source_downs.append(nn.Conv1d(nf, ch, 1, 1) if u == 1 else nn.Conv1d(nf, ch, u * 2, u, padding=u // 2))
            self.source_resblocks.append(ResBlock(ch, k, d))
        self.resblocks = nn.ModuleList()
        for i in range(len(rates)):
            ch = base // 2 ** (i + 1)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
                self.resblocks.append(ResBlock(ch, k, d))
        self.conv_post = WNConv(ch, nf, 7, 1, 3)
        self.f0_predictor = F0Predictor(cfg.in_channels, cfg.f0_channels)
        self.register_buffer("window", hann_periodic(cfg.n_fft), persistent=False)
        # the stock's cross-fade window is float64 (np.hamming), and so is the fade arithmetic
        self.register_buffer("fade", torch.from_numpy(np.hamming(2 * SOURCE_CACHE)), persistent=False)
        self.envelopes: Dict[int, torch.Tensor] = {}
        #: per mel length: the self-check's verdicts on the faster paths (:meth:`fast`)
        self.checked = CheckedPaths("step-audio2 HiFT", FAST_PATHS, self._trial, self._trial_inputs,
                                    _not_applicable, captured_only)

    @torch.no_grad()
    def prepare(self) -> None:
        """Fold weight norm / Snake constants on this device; forget envelopes built elsewhere."""
        fold_all(self)
        self.envelopes = {}
        self.checked.clear()

    # -- faster paths, checked per GPU -------------------------------------------------------------------
    def fast(self, frames: int) -> Dict[str, bool]:
        """Which of :data:`FAST_PATHS` run for a ``frames``-frame mel (checked once per length, see
        :class:`.checked.CheckedPaths`)."""
        return self.checked.which(frames, self.window.device, self.cfg)

    @torch.no_grad()
    def _trial_inputs(self, frames: int, path: str) -> List[torch.Tensor]:
        """A seeded random mel and source for :meth:`_trial` (no draws from the default generator)."""
        g = torch.Generator().manual_seed(2000 + frames)
        mel = torch.randn(1, self.cfg.in_channels, frames, generator=g).to(self.window.device)
        s = (0.1 * torch.randn(1, 1, frames * self.upp, generator=g)).to(self.window.device)
        return [mel, s]

    @torch.no_grad()
    def _trial(self, frames: int, path: str, on: bool, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        """:meth:`decode` of :meth:`_trial_inputs`, ``path`` off or on."""
        mel, s = inputs
        return [self.decode(mel, s, lanes=on and path == "parallel lanes", fused=on and path == "fused elementwise")]

    def verdicts(self) -> List[Verdict]:
        """The checks made so far (for the session info)."""
        return self.checked.verdicts()

    # -- spectral ----------------------------------------------------------------------------------
    def _stft(self, x: torch.Tensor):
        n, hop = self.cfg.n_fft, self.cfg.hop_len
        spec = torch.view_as_real(torch.stft(x, n, hop, n, window=self.window, return_complex=True))
        return spec[..., 0], spec[..., 1]                       # (1, n/2+1, frames) each

    def envelope(self, frames: int) -> torch.Tensor:
        """Window-square overlap-add for ``frames`` frames, trimmed as a centred istft trims it."""
        env = self.envelopes.get(frames)
        if env is None:
            n, hop = self.cfg.n_fft, self.cfg.hop_len
            total = n + hop * (frames - 1)
            w2 = self.window.pow(2).expand(1, frames, n)
            env = torch.ops.aten.unfold_backward(w2, [1, total], 1, n, hop)[:, n // 2: total - n // 2]
            if bool(env.abs().min().lt(1e-11)):
                raise ValueError("istft window overlap-add has zeros (NOLA)")
            self.envelopes[frames] = env
        return env

    def _istft(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        """The inverse STFT of ``magnitude`` and ``phase`` ``(1, F, frames)``: on the CPU ``torch.istft`` as the stock
        calls it (the same library call, so the same kernels on any CPU); elsewhere written out (see the module
        docstring: no host-side check, so a CUDA graph can hold it)."""
        n, hop = self.cfg.n_fft, self.cfg.hop_len
        magnitude = torch.clip(magnitude, max=1e2)
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))   # (1, F, frames)
        if spec.device.type == "cpu":
            return torch.istft(spec, n, hop, n, window=self.window)
        frames = spec.shape[-1]
        env = self.envelope(frames)
        y = torch.fft.irfft(spec.transpose(1, 2), n=n, dim=-1) * self.window.view(1, 1, n)
        total = n + hop * (frames - 1)
        y = torch.ops.aten.unfold_backward(y, [spec.shape[0], total], 1, n, hop)
        return y[:, n // 2: total - n // 2] / env

    # -- network -----------------------------------------------------------------------------------
    def _front(self, mel: torch.Tensor) -> torch.Tensor:
        """conv_pre -> leaky ReLU -> the first transposed conv: mel ``[1, 80, T]`` -> ``[1, C/2, 8T]``."""
        return self.ups[0](F.leaky_relu(self.conv_pre(mel), self.cfg.lrelu_slope))

    def _source_branch(self, i: int, s_stft: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """The source's STFT ``[1, n_fft + 2, frames]`` down to stage ``i``'s rate and width, through its res-block."""
        return self.source_resblocks[i](self.source_downs[i](s_stft), fused)

    def decode(self, x: torch.Tensor, s: torch.Tensor, lanes: bool = False,
               front: Optional[Forked] = None, fused: bool = False) -> torch.Tensor:
        """mel ``(1, 80, T)`` and source ``(1, 1, 480 T)`` -> speech ``(1, 480 T)``.

        ``lanes``: what does not depend on itself runs side by side (:mod:`.lanes`): the mel's front
        (``front``, when the caller forked it before making the source), the three source branches, and
        each stage's three res-blocks (summed in the stock's order once all are done). The same kernels
        on the same inputs either way. ``fused``: the Snake activations' tails in one kernel each
        (:func:`.fused.mul_add`, the same roundings)."""
        dev, n, nk = x.device, len(self.ups), len(self.cfg.resblock_kernel_sizes)
        if front is None:
            front = fork(lambda: self._front(x), dev, 0, lanes)
        re, im = self._stft(s.squeeze(1))
        s_stft = torch.cat([re, im], dim=1)                     # (1, n_fft + 2, frames)
        later = {i: fork(lambda i=i: self._source_branch(i, s_stft, fused), dev, i, lanes)
                 for i in range(n - 1, 0, -1)}
        src0 = self._source_branch(0, s_stft, fused)
        for i in range(n):
            x = front.join() if i == 0 else self.ups[i](F.leaky_relu(x, self.cfg.lrelu_slope))
            if i == n - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + (src0 if i == 0 else later[i].join())
            parts = parallel([lambda j=j, x=x: self.resblocks[i * nk + j](x, fused) for j in range(nk)], dev, lanes,
                             first_lane=n)
            xs = parts[0]
            for j in range(1, nk):
                xs += parts[j]
            x = xs / nk
        x = self.conv_post(F.leaky_relu(x))
        half = self.cfg.n_fft // 2 + 1
        speech = self._istft(torch.exp(x[:, :half, :]), torch.sin(x[:, half:, :]))
        return torch.clamp(speech, -self.cfg.audio_limit, self.cfg.audio_limit)

    def source(self, mel: torch.Tensor) -> torch.Tensor:
        """mel ``(1, 80, T)`` -> NSF excitation ``(1, 1, 480 T)`` (draws from the default generator)."""
        f0 = self.f0_predictor(mel)                              # (1, T)
        s = F.interpolate(f0[:, None], scale_factor=float(self.upp), mode="nearest").transpose(1, 2)
        return self.m_source(s).transpose(1, 2)

    # -- streaming block -------------------------------------------------------------------------------
    def regions(self, clock: Clock = STILL) -> List[Region]:
        """The overlap carried between chunks, under this block's short names (mount with ``prefixed``)."""
        return [Region("mel", (1, self.cfg.in_channels, None), clock, Fixed(MEL_CACHE),
                       stock_note="new tensor each call", doc="the last 8 mel frames [1, 80, 8]"),
                Region("source", (1, 1, None), clock, Fixed(SOURCE_CACHE), stock_note="new tensor each call",
                       doc="the last 3,840 NSF source samples [1, 1, 3840]"),
                Region("speech", (1, None), clock, Fixed(SOURCE_CACHE), stock_note="new tensor each call",
                       doc="the last 3,840 speech samples, faded into the next chunk [1, 3840]")]

    def stream(self, state: Mapping, chunk_mel: torch.Tensor, first: bool, last: bool) -> torch.Tensor:
        """One chunk ``(1, 80, T)`` with the 8-frame overlap and the cross-fade over this block's handles
        (``state["mel"]`` ...); returns the audio that is final now ``(1, n)``."""
        mel_cache, src_cache, speech_cache = (state[n].get() for n in ("mel", "source", "speech"))
        mel = chunk_mel if first else torch.cat([mel_cache, chunk_mel], dim=2)
        fast = self.fast(mel.shape[2])
        lanes, fused = fast["parallel lanes"], fast["fused elementwise"] and fused_worth_it(mel.device)
        front = fork(lambda: self._front(mel), mel.device, 0, lanes)   # beside the source, which draws
        s = self.source(mel)                                       # (1, 1, 480 T)
        if not first:
            s[:, :, :SOURCE_CACHE] = src_cache
        speech = self.decode(mel, s, lanes, front, fused)          # (1, 480 T)
        if not first:
            n = SOURCE_CACHE
            speech[..., :n] = speech[..., :n] * self.fade[:n] + speech_cache[..., -n:] * self.fade[n:]
        if not last:
            mel_cache.copy_(mel[..., -MEL_CACHE:])
            src_cache.copy_(s[:, :, -SOURCE_CACHE:])
            speech_cache.copy_(speech[:, -SOURCE_CACHE:])
            if first:
                return torch.cat([speech.new_zeros(1, SOURCE_CACHE), speech[:, :-SOURCE_CACHE]], dim=1)
            return speech[:, :-SOURCE_CACHE]
        return speech
