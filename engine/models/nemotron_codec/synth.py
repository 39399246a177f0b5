"""``duplexcadence synth --model nemotron-codec``: codes (frames x num_quantizers, .npy) -> waveform."""
from __future__ import annotations

import sys

import numpy as np
import torch

from engine.core.toggles import Toggles
from engine.npio import load_array, save_audio

from .tail import make_tail


def load_codes(path, num_quantizers: int, codebook_size: int) -> torch.Tensor:
    """CODES.npy as int64 [num_quantizers, frames] (the file holds frames x num_quantizers)."""
    if not path:
        raise ValueError("nemotron-codec synth needs --codes CODES.npy (int, frames x num_quantizers)")
    arr = load_array(path, "codes file")
    if not isinstance(arr, np.ndarray) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{path}: codes must be an integer array (frames x {num_quantizers})")
    if arr.ndim != 2 or arr.shape[1] != num_quantizers or arr.shape[0] == 0:
        raise ValueError(f"{path}: codes must be (frames, {num_quantizers}) with at least one frame, got {arr.shape}")
    if arr.min() < 0 or arr.max() >= codebook_size:
        raise ValueError(f"{path}: codes must lie in [0, {codebook_size}), got [{arr.min()}, {arr.max()}]")
    return torch.from_numpy(arr.astype(np.int64).T.copy())


def synth(args) -> int:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine")
    t = Toggles.from_mode(args.mode)
    tail = make_tail(size=args.size, device=args.device, seed=args.seed, checkpoint=args.checkpoint,
                     demand_sized=t.demand_sized, graph_replay=t.graph_replay)
    cfg = tail.model.cfg
    codes = load_codes(args.codes, cfg.num_quantizers, cfg.codebook_size)
    tail.start()
    mode = tail.toggles().mode
    audio = np.concatenate([tail.push(codes), tail.flush()]).astype(np.float32)
    out = save_audio(args.out, audio, cfg.sample_rate)
    print(f"nemotron-codec: {codes.shape[1]} frames x {cfg.num_quantizers} codebooks -> {audio.size} samples "
          f"({audio.size / cfg.sample_rate:.2f} s at {cfg.sample_rate} Hz), mode {mode}, "
          f"{'seeded random' if args.checkpoint is None else 'checkpoint'} weights -> {out}", file=sys.stderr)
    return 0
