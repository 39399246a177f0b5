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
from engine.core.toggles import Toggles
from engine.registry import ModelEntry, Option, register
from engine.npio import load_array, save_audio

from . import weights as W
from .config import MimiConfig, preset
from .model import MimiDecoder
from .tail import MimiTail, build_model, check_codes, make_tail



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
    t = Toggles.from_mode(args.mode)
    tail = make_tail(size=args.size, device=args.device, seed=args.seed, checkpoint=args.checkpoint,
                     num_codebooks=k, demand_sized=t.demand_sized, graph_replay=t.graph_replay)
    tail.start()
    audio = np.concatenate([tail.push(check_codes(codes[:k], k, tail.cfg.bins)), tail.flush()]).astype(np.float32)
    out = save_audio(args.out, audio, tail.cfg.sample_rate)
    print(f"mimi: {codes.shape[1]} frames x {k} codebooks -> {audio.shape[0]} samples "
          f"({audio.shape[0] / tail.cfg.sample_rate:.2f} s at {tail.cfg.sample_rate} Hz), mode {tail.executor.mode}, "
          f"{'seeded random' if args.checkpoint is None else 'checkpoint'} weights -> {out}", file=sys.stderr)
    for v in tail.fast_paths():
        print(f"fast path: {v.line()}", file=sys.stderr)
    return 0


def resolve_checkpoint(path: str) -> str:
    """A Mimi ``.safetensors`` file (or a folder holding ``tokenizer-*.safetensors``), checked by its
    header: every key the released decoder reads, at its shape (no weights are loaded)."""
    from pathlib import Path

    from engine.models import checkfiles
    from .config import RELEASED
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(p.glob("tokenizer-*.safetensors")) or sorted(p.glob("*mimi*.safetensors"))
        if not found:
            raise ValueError(f"Mimi checkpoint folder {p} lacks a tokenizer-*.safetensors file")
        p = found[0]
    if not p.is_file():
        raise ValueError(f"Mimi checkpoint {p} does not exist")
    if p.suffix not in (".safetensors", ".sft", ".sfts"):
        raise ValueError(f"Mimi checkpoint {p} is not a .safetensors file")
    have = checkfiles.safetensors_header(p)
    bad = [k for k, shape in W.decoder_keys(RELEASED).items()
           if tuple(have.get(k, have.get(W._alias(k), (None, None)))[1] or ()) != tuple(shape)]
    if bad:
        raise ValueError(f"{p} is not a Mimi checkpoint: {len(bad)} decoder key(s) missing or mis-shaped, "
                         f"e.g. {bad[0]}")
    return str(p)


register(ModelEntry(name="mimi", title="Mimi decoder (Moshi, Hibiki, Sesame CSM)",
                    architecture="split RVQ + x2 upsample + 8-layer ring-KV transformer + causal SEANet",
                    plan=plan, make_tail=make_tail, synth=synth, resolve_checkpoint=resolve_checkpoint,
                    checkpoint_hint="Mimi .safetensors (tokenizer-e351c8d8-checkpoint125.safetensors)", order=10,
                    options=(Option("--codes", "int .npy (codebooks x frames)", kind="file"),
                             Option("--num-codebooks", "codebooks to decode (8 Moshi, 32 CSM)", kind="count")),
                    bench=("engine.bench.mimi", "Mimi decoder: moshi eager / moshi graphs vs our modes (GPU)")))

__all__ = ["MimiConfig", "MimiDecoder", "MimiTail", "build_model", "make_tail", "plan", "synth"]
