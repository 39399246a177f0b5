"""Mimi decoder configuration: the released dims, a tiny test size, and the clocks they imply.

Mimi turns 12.5 Hz codes into 24 kHz audio: split RVQ decode -> depthwise transposed-conv
upsample x2 (25 Hz) -> causal transformer (ring KV cache, RoPE, layer scale) -> causal SEANet
decoder (transposed convs by ``ratios``). The names follow moshi's ``_seanet_kwargs``,
``_quantizer_kwargs`` and ``_transformer_kwargs`` so a checkpoint's layout can be checked
against them.

Whole-second cadence: second ``k`` covers frames ``floor(r*k) .. floor(r*(k+1)) - 1`` for the frame
rate ``r``; at 12.5 Hz that is 12 frames for even seconds and 13 for odd ones (second 0 has 12).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Dict, List, Tuple


@dataclass(frozen=True)
class MimiConfig:
    """Dimensions of one Mimi decoder (defaults: the released tokenizer)."""

    sample_rate: int = 24000
    frame_rate: float = 12.5
    # quantizer
    n_q: int = 32                 # codebooks in the checkpoint (1 semantic + n_q - 1 acoustic)
    n_q_semantic: int = 1
    bins: int = 2048
    codebook_dim: int = 256
    # latent / SEANet
    dimension: int = 512
    n_filters: int = 64
    ratios: Tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    n_residual_layers: int = 1
    dilation_base: int = 2
    compress: int = 2
    # transformer
    num_heads: int = 8
    num_layers: int = 8
    dim_feedforward: int = 2048
    context: int = 250
    max_period: float = 10000.0
    layer_scale: float = 0.01

    def __post_init__(self):
        if self.dimension % self.num_heads or (self.dimension // self.num_heads) % 2:
            raise ValueError("dimension must split into heads of even size")
        if self.n_q <= self.n_q_semantic:
            raise ValueError("n_q must exceed n_q_semantic")
        if self.upsample_stride * self.frame_rate * self.hop_length != self.sample_rate:
            raise ValueError(f"sample_rate {self.sample_rate} != frame_rate {self.frame_rate} x "
                             f"upsample {self.upsample_stride} x hop {self.hop_length}")

    # -- derived sizes ---------------------------------------------------------------------------
    @property
    def hop_length(self) -> int:
        """Samples per transformer step (the SEANet's total upsampling)."""
        return int(math.prod(self.ratios))

    @property
    def upsample_stride(self) -> int:
        """Transformer steps per frame (12.5 Hz -> 25 Hz: 2)."""
        enc_rate = self.sample_rate / (math.prod(self.ratios))
        stride = enc_rate / self.frame_rate
        if stride != int(stride) or stride < 1:
            raise ValueError(f"encoder rate {enc_rate} is not an integer multiple of frame rate {self.frame_rate}")
        return int(stride)

    @property
    def frame_size(self) -> int:
        """Output samples per 12.5 Hz frame (1920)."""
        return self.upsample_stride * self.hop_length

    @property
    def head_dim(self) -> int:
        return self.dimension // self.num_heads

    def seconds_pattern(self) -> Tuple[int, ...]:
        """Frames in second k, for one period of seconds: (12, 13) at 12.5 Hz."""
        r = Fraction(self.frame_rate).limit_denominator(1000)
        period = r.denominator
        return tuple(math.floor(r * (k + 1)) - math.floor(r * k) for k in range(period))

    def frames_before(self, second: int) -> int:
        """Frames in all seconds before ``second`` (floor(12.5 k))."""
        r = Fraction(self.frame_rate).limit_denominator(1000)
        return math.floor(r * second)

    def stage_channels(self) -> List[Tuple[int, int]]:
        """(in, out) channels of each SEANet upsampling stage."""
        mult = 2 ** len(self.ratios)
        out = []
        for _ in self.ratios:
            out.append((mult * self.n_filters, mult * self.n_filters // 2))
            mult //= 2
        return out

    def units_per_frame(self) -> Dict[str, int]:
        """Units each decoder clock advances per 12.5 Hz frame, by clock name."""
        units = {"frames": 1, "steps25": self.upsample_stride}
        per = self.upsample_stride
        for i, r in enumerate(self.ratios):
            per *= r
            units[f"rate{i}"] = per
        return units

    def moshi_kwargs(self) -> dict:
        """The same dims as moshi's ``get_mimi`` config dict (for the test oracle)."""
        seanet = {
            "channels": 1, "dimension": self.dimension, "causal": True, "n_filters": self.n_filters,
            "n_residual_layers": self.n_residual_layers, "activation": "ELU", "compress": self.compress,
            "dilation_base": self.dilation_base, "disable_norm_outer_blocks": 0,
            "kernel_size": self.kernel_size, "residual_kernel_size": self.residual_kernel_size,
            "last_kernel_size": self.last_kernel_size, "norm": "none", "pad_mode": "constant",
            "ratios": list(self.ratios), "true_skip": True,
        }
        quantizer = {"dimension": self.codebook_dim, "n_q": self.n_q, "bins": self.bins,
                     "input_dimension": self.dimension, "output_dimension": self.dimension}
        transformer = {
            "d_model": self.dimension, "num_heads": self.num_heads, "num_layers": self.num_layers,
            "causal": True, "layer_scale": self.layer_scale, "context": self.context, "conv_layout": True,
            "max_period": self.max_period, "gating": "none", "norm": "layer_norm",
            "positional_embedding": "rope", "dim_feedforward": self.dim_feedforward,
            "input_dimension": self.dimension, "output_dimensions": [self.dimension],
        }
        return {"sample_rate": self.sample_rate, "channels": 1, "frame_rate": self.frame_rate,
                "seanet": seanet, "quantizer": quantizer, "transformer": transformer}


RELEASED = MimiConfig()

#: tiny dims for fast CPU tests: 2 layers, context 10 (the ring wraps after 5 frames), 96 samples/frame
TINY = MimiConfig(sample_rate=1200, n_q=32, bins=64, codebook_dim=16, dimension=32, n_filters=4,
                  ratios=(4, 3, 2, 2), kernel_size=7, last_kernel_size=3, num_heads=4, num_layers=2,
                  dim_feedforward=64, context=10)

PRESETS = {"released": RELEASED, "tiny": TINY}


def preset(size: str) -> MimiConfig:
    if size not in PRESETS:
        raise ValueError(f"unknown Mimi size {size!r} (expected one of: {', '.join(PRESETS)})")
    return PRESETS[size]


def with_context(cfg: MimiConfig, context: int) -> MimiConfig:
    """The same dims with another attention context (ring capacity)."""
    return replace(cfg, context=int(context))
