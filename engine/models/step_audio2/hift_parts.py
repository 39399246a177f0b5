"""Building blocks of the HiFT vocoder: weight-normed convs, Snake residual blocks, the F0 predictor and
the neural-source-filter excitation (SineGen2 at 24 kHz).

Weight norm is folded once per device (:meth:`WNConv.fold`): the stock recomputes ``_weight_norm(v, g)``
on every call with the same kernel, so folding it once gives the same weights and saves ~3 kernels per conv.
Snake's ``1 / (alpha + 1e-9)`` is likewise folded once. Parameter names follow the released hift.pt
(``parametrizations.weight.original0/1``; old-style ``weight_g/weight_v`` are mapped at load time).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.graphs import session_generator

from .fused import mul_add


class _WeightNormParams(nn.Module):
    def __init__(self, g: torch.Tensor, v: torch.Tensor):
        super().__init__()
        self.original0 = nn.Parameter(g)    # g: (dim0, 1, 1)
        self.original1 = nn.Parameter(v)    # v: the direction, the conv weight's shape


class WNConv(nn.Module):
    """Conv1d / ConvTranspose1d with weight norm over dim 0, the weight folded per device."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1,
                 transpose: bool = False):
        super().__init__()
        self.stride, self.padding, self.dilation, self.transpose = stride, padding, dilation, transpose
        shape = (cin, cout, kernel) if transpose else (cout, cin, kernel)
        self.parametrizations = nn.ModuleDict(
            {"weight": _WeightNormParams(torch.ones(shape[0], 1, 1), torch.zeros(shape))})
        self.bias = nn.Parameter(torch.zeros(cout))
        self.register_buffer("weight", torch.zeros(shape), persistent=False)

    @torch.no_grad()
    def fold(self) -> None:
        """weight = g * v / |v| on the bias's device; g and v are then parked on the CPU (the state dict
        keeps them; the device keeps one weight instead of three)."""
        p = self.parametrizations["weight"].to(self.bias.device)
        self.weight = torch._weight_norm(p.original1, p.original0, 0)
        p.to("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.transpose:
            return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding)
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)


class Snake(nn.Module):
    """x + 1/alpha * sin(alpha x)^2, per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))
        self.register_buffer("inv", torch.ones(1, channels, 1), persistent=False)

    @torch.no_grad()
    def fold(self) -> None:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        self.inv = 1.0 / (alpha + 0.000000001)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """``fused``: the square, the ``1/alpha`` factor and the residual add in one kernel (the same roundings,
        :func:`.fused.mul_add`; a checked GPU path)."""
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        if fused:
            return mul_add(torch.sin(x * alpha), self.inv, x, square=True)
        return x + self.inv * torch.pow(torch.sin(x * alpha), 2)


class ResBlock(nn.Module):
    """Three (Snake, dilated conv, Snake, conv) residual units."""

    def __init__(self, channels: int, kernel: int, dilations: Sequence[int]):
        super().__init__()
        pad = lambda d: int((kernel * d - d) / 2)      # noqa: E731  (same-length padding)
        self.convs1 = nn.ModuleList(WNConv(channels, channels, kernel, 1, pad(d), d) for d in dilations)
        self.convs2 = nn.ModuleList(WNConv(channels, channels, kernel, 1, pad(1), 1) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x, fused)), fused)) + x
        return x


class F0Predictor(nn.Module):
    """Five conv(k=3)+ELU layers and a linear head: mel ``(1, 80, T)`` -> |f0| ``(1, T)``."""

    def __init__(self, in_channels: int = 80, channels: int = 512):
        super().__init__()
        layers = []
        for i in range(5):
            layers += [WNConv(in_channels if i == 0 else channels, channels, 3, 1, 1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.condnet(x).transpose(1, 2)
        return torch.abs(self.classifier(x).squeeze(-1))


class SineSource(nn.Module):
    """NSF source (SourceModuleHnNSF2 + SineGen2): the harmonics of f0 as sines (noise where unvoiced), merged.

    Draws, in the stock's order, from the device's default generator: ``rand(1, harmonics+1)`` for the
    start phases (which never reach the output, see :meth:`_sines`), ``randn`` like the harmonics for the
    additive noise, and ``randn`` like ``uv`` for the stock's noise branch, which it discards (drawn all the
    same: the generator's offset must match). In a hosted session the draws name its own generator state
    (:func:`~engine.core.graphs.session_generator`, the state its captures register), so an eager second
    beside another session's capture never moves the state that capture registered; ``empty_like(x).normal_``
    is what ``randn_like(x)`` runs (the same layout, kernel and offset).
    """

    def __init__(self, sampling_rate: int, upsample_scale: int, harmonics: int, sine_amp: float,
                 noise_std: float, voiced_threshold: float):
        super().__init__()
        if upsample_scale < 3:
            raise ValueError(f"the NSF source needs at least 3 samples per frame, got {upsample_scale}")
        self.sr, self.scale = sampling_rate, upsample_scale
        self.sine_amp, self.noise_std, self.threshold = sine_amp, noise_std, voiced_threshold
        self.l_linear = nn.Linear(harmonics + 1, 1)
        self.register_buffer("harmonics", torch.arange(1, harmonics + 2, dtype=torch.float32).view(1, 1, -1),
                             persistent=False)

    def _sines(self, f: torch.Tensor) -> torch.Tensor:
        """Harmonic frequencies ``f`` ``[1, L, H]`` Hz, ``L = T * scale`` -> sin(phase) ``[1, L, H]``.

        A sine's phase is 2 pi times the running count of cycles. Per sample the count advances by
        ``f / sr`` cycles, whole cycles dropped (they leave the sine unchanged). The count is kept at the frame
        rate: frame ``t`` advances by ``scale`` times the per-sample advance at its centre, which for an even
        ``scale`` is the mean of its two middle samples (the middle one for an odd scale); the frame phases are
        then spread over the samples by linear interpolation.

        A random start phase per overtone (none for the fundamental) belongs to sample 0, which is no frame's
        centre once ``scale > 2`` (checked at construction): it cannot reach the output, so it is only drawn,
        to keep the generator where the stock leaves it.
        """
        batch, length, harmonics = f.shape
        frames, s = length // self.scale, self.scale
        cycles = torch.remainder(f / self.sr, 1.0)                               # [1, L, H] cycles per sample
        torch.rand(batch, harmonics, device=f.device, generator=session_generator(f.device))  # drawn, unread
        by_frame = cycles.view(batch, frames, s, harmonics)                     # [1, T, scale, H]
        lo, hi = (s - 1) // 2, s // 2
        centre = by_frame[:, :, lo] if lo == hi else (by_frame[:, :, lo] + by_frame[:, :, hi]) * 0.5  # [1, T, H]
        # summed over frames laid out harmonic-major, as the stock's cumsum reads its interpolated [1, H, T]
        centre = centre.transpose(1, 2).contiguous().transpose(1, 2)
        frame_phase = torch.cumsum(centre, dim=1) * (2 * math.pi) * s           # [1, T, H] radians x scale
        phase = F.interpolate(frame_phase.transpose(1, 2), scale_factor=s, mode="linear")   # [1, H, L]
        return torch.sin(phase.transpose(1, 2))

    def forward(self, f0: torch.Tensor) -> torch.Tensor:
        """f0 ``(1, L, 1)`` at the sample rate -> excitation ``(1, L, 1)``."""
        sines = self._sines(torch.multiply(f0, self.harmonics)) * self.sine_amp
        uv = (f0 > self.threshold).type(torch.float32)
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        gen = session_generator(f0.device)
        sines = sines * uv + noise_amp * torch.empty_like(sines).normal_(generator=gen)
        merged = torch.tanh(self.l_linear(sines))
        torch.empty_like(uv).normal_(generator=gen)   # the stock's discarded noise branch: keeps the RNG in step
        return merged


def fold_all(module: nn.Module) -> None:
    """Fold weight norm and Snake constants of every submodule (after moving to the final device)."""
    for m in module.modules():
        if isinstance(m, (WNConv, Snake)):
            m.fold()
