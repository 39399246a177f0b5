"""Mimi decoder (Moshi, Hibiki, Sesame CSM) on the engine: whole-second steps, bit-identical to moshi.

Registers the ``mimi`` model: ``plan(size=, steps=)``, ``make_tail(...)`` and ``synth(args)`` for
``duplexcadence synth --model mimi --codes CODES.npy --out OUT.npy [--checkpoint FILE]
[--num-codebooks N] [--device cpu|cuda] [--mode stock|demand|graphs]``.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from engine.core import make_plan
from engine.models.registry import ModelEntry, register
from engine.npio import load_array

from .config import MimiConfig, preset
from .model import MimiDecoder
from .tail import MimiTail, build_model, check_codes, make_tail

MODES = {"stock": (False, False), "demand": (True, False), "graphs": (True, True)}


def plan(size: str = "released", steps=None, **_):
    """The planner's view of a live Mimi session (no weights are allocated)."""
    with torch.device("meta"):
        m = MimiDecoder(preset(size))
    return make_plan(m.regions(), m.spec(steps))


def synth(args) -> int:
    """Decode CODES.npy (codebooks x frames) to a float32 24 kHz waveform in OUT.npy."""
    if not args.codes:
        raise ValueError("mimi synth needs --codes CODES.npy (int, codebooks x frames)")
    codes = load_array(args.codes, "codes file")
    if not isinstance(codes, np.ndarray) or not np.issubdtype(codes.dtype, np.integer):
        raise ValueError(f"{args.codes}: codes must be an integer array (codebooks x frames)")
    if codes.ndim != 2:
        raise ValueError(f"{args.codes}: codes must be 2-D (codebooks x frames), got shape {codes.shape}")
    k = args.num_codebooks or codes.shape[0]
    if codes.shape[0] < k:
        raise ValueError(f"{args.codes}: {codes.shape[0]} codebooks, --num-codebooks asks for {k}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine")
    demand, graphs = MODES[args.mode]
    tail = make_tail(size=args.size, device=args.device, seed=args.seed, checkpoint=args.checkpoint,
                     num_codebooks=k, demand_sized=demand, graph_replay=graphs)
    tail.start()
    audio = np.concatenate([tail.push(check_codes(codes[:k], k, tail.cfg.bins)), tail.flush()]).astype(np.float32)
    np.save(args.out, audio)
    print(f"mimi: {codes.shape[1]} frames x {k} codebooks -> {audio.shape[0]} samples "
          f"({audio.shape[0] / tail.cfg.sample_rate:.2f} s at {tail.cfg.sample_rate} Hz), mode {tail.executor.mode}, "
          f"{'seeded random' if args.checkpoint is None else 'checkpoint'} weights -> {args.out}", file=sys.stderr)
    return 0


register(ModelEntry(name="mimi", title="Mimi decoder (Moshi, Hibiki, Sesame CSM)",
                    architecture="split RVQ + x2 upsample + 8-layer ring-KV transformer + causal SEANet",
                    plan=plan, make_tail=make_tail, synth=synth))

__all__ = ["MimiConfig", "MimiDecoder", "MimiTail", "build_model", "make_tail", "plan", "synth"]
