"""Voice prompts for the Step-Audio2 tail: an .npz, a .wav (through the checkpoint's ONNX front-end), or a
seeded synthetic one (for random weights).

``.npz``: ``prompt_tokens`` (n,) int in [0, 6561), ``prompt_mel`` (frames, 80) float, ``speaker_embedding``
(192,) float. As the stock prepares a prompt, the mel is made exactly 2 frames a token: shorter ones are
padded by repeating the last frame, longer ones cut.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from engine.npio import load_array

from .config import TOKEN_RATE
from .stream import Prompt, fit_mel, make_prompt  # noqa: F401  (built from arrays in stream.py)

NPZ_KEYS = ("prompt_tokens", "prompt_mel", "speaker_embedding")


def load_npz(path) -> Prompt:
    path = Path(path)
    data = load_array(path, "prompt file")
    if not hasattr(data, "files"):
        raise ValueError(f"{path}: a voice prompt .npz holds {', '.join(NPZ_KEYS)}; this is a single array")
    missing = [k for k in NPZ_KEYS if k not in data.files]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)} (needs {', '.join(NPZ_KEYS)})")
    return make_prompt(data["prompt_tokens"], data["prompt_mel"], data["speaker_embedding"], source=str(path))


def synthetic_prompt(seconds: float = 6.0, seed: int = 0) -> Prompt:
    """A random prompt of ``seconds`` (25 tokens a second) for seeded random weights."""
    n = max(1, int(round(seconds * TOKEN_RATE)))
    g = torch.Generator().manual_seed(int(seed) + 101)
    return Prompt(torch.randint(0, 6561, (1, n), generator=g), torch.randn(1, 2 * n, 80, generator=g),
                  torch.randn(1, 192, generator=g))


def load_prompt(path: Optional[str], checkpoint: Optional[str] = None, seed: int = 0) -> Prompt:
    """``.npz`` or ``.wav`` (the latter needs the checkpoint folder's ONNX models); None: synthetic 6 s."""
    if not path:
        return synthetic_prompt(6.0, seed)
    suffix = Path(path).suffix.lower()
    if suffix == ".npz":
        return load_npz(path)
    if suffix == ".wav":
        if not checkpoint:
            raise ValueError("a .wav prompt needs --checkpoint (its speech_tokenizer_v2_25hz.onnx and campplus.onnx)")
        from .prompt_audio import prompt_from_wav
        return prompt_from_wav(path, checkpoint)
    raise ValueError(f"prompt {path}: expected a .npz or a .wav file")
