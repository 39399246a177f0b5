"""``duplexcadence synth --model step-audio2``: speech tokens (.npy) -> float32 waveform (.npy)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from engine.npio import load_array, save_audio

from .prompt import load_prompt
from .stream import synthesize
from .weights import load_model


def load_tokens(path) -> list:
    if not path:
        raise ValueError("--tokens is required for step-audio2 (a 1-D int .npy of 25 Hz speech tokens)")
    p = Path(path)
    arr = load_array(p, "tokens file")
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{p}: an .npz archive; --tokens takes a 1-D int .npy array")
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{p}: expected a non-empty 1-D integer array, got {arr.dtype} {arr.shape}")
    if arr.min() < 0 or arr.max() >= 6561:
        raise ValueError(f"{p}: speech tokens must be in [0, 6561)")
    return [int(x) for x in arr]


def synth(args) -> int:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    tokens = load_tokens(args.tokens)
    prompt = load_prompt(args.prompt, args.checkpoint, args.seed)
    model = load_model(args.checkpoint, args.size, args.seed, args.device)
    chunks = synthesize(model, prompt, tokens, args.mode, args.seed)
    wav = np.concatenate(chunks).astype(np.float32)
    out = save_audio(args.out, wav, 24000)
    print(f"wrote {out}: {wav.size} samples ({wav.size / 24000:.2f} s at 24 kHz), {len(chunks)} chunks, "
          f"mode {args.mode}", file=sys.stderr)
    return 0
