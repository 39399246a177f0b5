"""Dimensions of the Nemotron VoiceChat EAR-TTS codec decoder, presets, and reading ``codec_config``.

The decoder turns ``num_quantizers`` codebook indices per frame into ``wav_to_token_ratio`` samples:
residual codebook sum -> ``len(rates)`` stages of [transposed conv x rate, ``num_blocks`` causal
ConvNeXt blocks] -> 1x1 conv to ``n_fft + 2`` channels (log-magnitude | phase) -> iSTFT with a
Hann window, ``hop_length`` samples per column. The decoder's stages run the encoder's
``channel_mult`` and ``rates`` in reverse (the names are the config's, which describe the encoder).

Whole-second cadence as for every 12.5 Hz decoder: second ``k`` covers frames
``floor(12.5 k) .. floor(12.5 (k+1)) - 1``, 12 frames in even seconds and 13 in odd ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any, Dict, Tuple


@dataclass(frozen=True)
class CodecConfig:
    """One codec's dimensions (defaults: the released VoiceChat codec, 22.05 kHz, 12.5 Hz frames)."""

    latent_size: int = 512
    n_fft: int = 16
    hop_length: int = 4
    base_hidden_size: int = 384
    channel_mult: Tuple[int, ...] = (1, 2, 4)
    rates: Tuple[int, ...] = (7, 7, 9)
    num_blocks: int = 3
    kernel_size: int = 7
    groups: int = 1
    codebook_size: int = 1024
    num_quantizers: int = 31
    wav_to_token_ratio: int = 1764
    sample_rate: int = 22050

    def __post_init__(self):
        if len(self.channel_mult) != len(self.rates) or not self.rates:
            raise ValueError("codec_config: channel_mult and rates must be non-empty and of equal length")
        if self.n_fft % 2 or self.n_fft - self.hop_length < 2 or self.hop_length < 1:
            raise ValueError(f"codec_config: n_fft {self.n_fft} must be even and exceed hop_length "
                             f"{self.hop_length} by at least 2 (the streaming iSTFT trims both sides)")
        if self.hop_length * math.prod(self.rates) != self.wav_to_token_ratio:
            raise ValueError(f"codec_config: wav_to_token_ratio {self.wav_to_token_ratio} != hop_length "
                             f"{self.hop_length} x prod(rates) {math.prod(self.rates)}")
        if self.kernel_size < 2 or self.num_blocks < 0 or self.num_quantizers < 1 or self.codebook_size < 1:
            raise ValueError("codec_config: kernel_size >= 2, num_blocks >= 0, num_quantizers and "
                             "codebook_size >= 1 are required")
        for c_in, c_out in self.stage_channels():
            if c_in % self.groups or c_out % self.groups:
                raise ValueError(f"codec_config: groups {self.groups} must divide every stage's channels")

    # -- derived sizes ---------------------------------------------------------------------------------
    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.wav_to_token_ratio

    def stage_channels(self) -> Tuple[Tuple[int, int], ...]:
        """(input, output) channels of each decoder stage's transposed conv."""
        mult = tuple(reversed(self.channel_mult))
        outs = [self.base_hidden_size * m for m in mult]
        ins = [self.latent_size] + outs[:-1]
        return tuple(zip(ins, outs))

    def stage_rates(self) -> Tuple[int, ...]:
        return tuple(reversed(self.rates))

    def columns_per_frame(self) -> Tuple[int, ...]:
        """Time columns one frame occupies after each stage (9, 63, 441 for the released codec)."""
        out, n = [], 1
        for r in self.stage_rates():
            n *= r
            out.append(n)
        return tuple(out)

    @property
    def spec_bins(self) -> int:
        return self.n_fft // 2 + 1

    @property
    def ola_pad(self) -> int:
        """Samples the overlap-add drops at each end of a call's fold ((n_fft - hop) // 2)."""
        return (self.n_fft - self.hop_length) // 2

    @property
    def spec_history(self) -> int:
        """Spectrogram columns a streaming call carries over (twice ceil(ola_pad / hop))."""
        return 2 * math.ceil(self.ola_pad / self.hop_length)

    @property
    def trim(self) -> int:
        """Samples the streaming call trims at each end after the overlap-add."""
        return self.spec_history // 2 * self.hop_length

    def seconds_pattern(self) -> Tuple[int, ...]:
        """Frames per whole second, periodic: (12, 13) at 12.5 Hz."""
        r = Fraction(self.sample_rate, self.wav_to_token_ratio)
        period = r.denominator
        return tuple(int(math.floor(r * (k + 1)) - math.floor(r * k)) for k in range(period))


RELEASED = CodecConfig()
#: CPU tests and the CPU app: every mechanism of the released codec at small widths (900 Hz audio)
TINY = CodecConfig(latent_size=32, base_hidden_size=16, rates=(2, 3, 3), wav_to_token_ratio=72, sample_rate=900)
PRESETS = {"released": RELEASED, "tiny": TINY}


def preset(size: str) -> CodecConfig:
    if size not in PRESETS:
        raise ValueError(f"unknown Nemotron codec size {size!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[size]


#: the range each ``codec_config`` field may take (sane for this model family; the released codec's
#: values sit well inside): scalar fields, then the list fields (each entry's range, the longest list)
LIMITS: Dict[str, Tuple[int, int]] = {
    "latent_size": (1, 8192), "n_fft": (2, 8192), "hop_length": (1, 8192), "base_hidden_size": (1, 8192),
    "num_blocks": (0, 64), "kernel_size": (2, 63), "groups": (1, 8192), "codebook_size": (1, 1 << 20),
    "num_quantizers": (1, 256), "wav_to_token_ratio": (1, 1 << 20), "sample_rate": (100, 384_000)}
LIST_LIMITS: Dict[str, Tuple[int, int]] = {"channel_mult": (1, 64), "rates": (1, 64)}
MAX_STAGES = 8


def _list_field(name: str, v: Any, source: str) -> Tuple[int, ...]:
    lo, hi = LIST_LIMITS[name]
    if not isinstance(v, (list, tuple)) or not 1 <= len(v) <= MAX_STAGES or \
            not all(isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi for x in v):
        shown = f"a list of {len(v)}" if isinstance(v, (list, tuple)) else f"{v!r:.40}"
        raise ValueError(f"{source}: codec_config.{name} must be a list of 1 to {MAX_STAGES} whole numbers "
                         f"from {lo} to {hi}, got {shown}")
    return tuple(v)


def _scalar_field(name: str, v: Any, source: str) -> int:
    lo, hi = LIMITS[name]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{source}: codec_config.{name} must be a whole number from {lo:,} to {hi:,}, "
                         f"got {v!r:.40}")
    return v


def from_mapping(d: Dict[str, Any], source: str) -> CodecConfig:
    """A :class:`CodecConfig` from a ``codec_config`` mapping (unknown keys ignored, missing ones
    default to the released codec's); ValueError naming ``source`` when a value is wrong: not a whole
    number (a bool, a float, a list where a number belongs), or outside :data:`LIMITS`."""
    if not isinstance(d, dict):
        raise ValueError(f"{source}: codec_config must be a mapping")
    kw: Dict[str, Any] = {}
    for f in fields(CodecConfig):
        if f.name in d:
            v = d[f.name]
            kw[f.name] = _list_field(f.name, v, source) if f.name in LIST_LIMITS else _scalar_field(f.name, v, source)
    try:
        return replace(RELEASED, **kw)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
