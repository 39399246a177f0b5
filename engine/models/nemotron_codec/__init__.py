"""Nemotron VoiceChat's EAR-TTS codec decoder on the engine: whole-second steps, bit-identical to nemo.

Everything about this decoder lives in this package and reaches the rest of the product through the
registry: ``plan(size=, steps=)``, ``make_tail(...)``, ``resolve_checkpoint(path)``, ``synth(args)``
for ``duplexcadence synth --model nemotron-codec --codes CODES.npy --out OUT.npy [--checkpoint DIR]``
and its benchmark, ``duplexcadence-bench nemotron-codec``.
"""
from __future__ import annotations

import torch

from engine.core import make_plan
from engine.registry import ModelEntry, Option, register

from .config import CodecConfig, preset
from .model import NemotronCodecDecoder
from .tail import NAME, TITLE, NemotronCodecTail, build_model, make_tail


def plan(size: str = "released", steps=None, **_):
    """The planner's view of a live session (no weights are allocated)."""
    with torch.device("meta"):
        m = NemotronCodecDecoder(preset(size))
    return make_plan(m.regions(), m.spec(steps))


def resolve_checkpoint(path: str) -> str:
    from .checkpoint import resolve
    return resolve(path)


def _synth(args) -> int:
    from .synth import synth
    return synth(args)


register(ModelEntry(name=NAME, title=TITLE,
                    architecture="31 residual codebooks + 3 x [transposed conv, 3 causal ConvNeXt] + iSTFT head",
                    plan=plan, make_tail=make_tail, synth=_synth, resolve_checkpoint=resolve_checkpoint,
                    checkpoint_hint="codec folder (codec_config.yaml + codec.safetensors) or VoiceChat folder",
                    options=(Option("--codes", "int .npy (codebooks x frames)", kind="file"),),
                    order=20,
                    bench=("engine.bench.nemotron_codec",
                           "Nemotron codec: nemo's per-frame cached and window decodes vs our modes (GPU)")))

__all__ = ["CodecConfig", "NemotronCodecDecoder", "NemotronCodecTail", "build_model", "make_tail", "plan"]
