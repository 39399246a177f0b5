"""The stock runtime, for the benchmark and the tests only: nemo's ``ear_tts_vae_codec.py`` loaded by path.

The product never imports nemo. ``nemo-toolkit==3.0.0`` (installed ``--no-deps`` as a test oracle)
holds the codec in ``nemo/collections/speechlm2/modules/ear_tts_vae_codec.py``, which needs only
torch and omegaconf: it is loaded as a lone module (nemo's package ``__init__`` is never run), with
``librosa`` stubbed (only the encoder's mel filterbank uses it). Where nemo is not installed (the GPU
machine), a copy of the file on ``sys.path`` (e.g. ``.oracle/ear_tts_vae_codec.py``) is used.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Dict, List, Optional

import torch

NEMO_FILE = Path("nemo/collections/speechlm2/modules/ear_tts_vae_codec.py")
_module = None


def source() -> Optional[Path]:
    """Where the stock file is, or None."""
    spec = importlib.util.find_spec("nemo") if "nemo" not in sys.modules else sys.modules["nemo"].__spec__
    roots = [Path(p).parent for p in (spec.submodule_search_locations or [])] if spec else []
    for root in roots:
        if (root / NEMO_FILE).is_file():
            return root / NEMO_FILE
    for entry in sys.path:
        p = Path(entry or ".") / NEMO_FILE.name
        if p.is_file():
            return p
    return None


def available() -> bool:
    return source() is not None and importlib.util.find_spec("omegaconf") is not None


def module():
    """nemo's codec module (loaded once)."""
    global _module
    if _module is None:
        path = source()
        if path is None:
            raise ModuleNotFoundError("nemo's ear_tts_vae_codec.py (test oracle) is not installed")
        stubbed = "librosa" not in sys.modules and importlib.util.find_spec("librosa") is None
        if stubbed:
            sys.modules["librosa"] = types.ModuleType("librosa")
        try:
            spec = importlib.util.spec_from_file_location("stock_ear_tts_vae_codec", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        finally:
            if stubbed:
                del sys.modules["librosa"]
        _module = mod
    return _module


def config_dict(cfg) -> Dict[str, object]:
    """Our :class:`CodecConfig` as nemo's ``codec_config`` mapping."""
    return {"latent_size": cfg.latent_size, "n_fft": cfg.n_fft, "hop_length": cfg.hop_length,
            "base_hidden_size": cfg.base_hidden_size, "channel_mult": list(cfg.channel_mult),
            "rates": list(cfg.rates), "num_blocks": cfg.num_blocks, "kernel_size": cfg.kernel_size,
            "groups": cfg.groups, "codebook_size": cfg.codebook_size, "num_quantizers": cfg.num_quantizers,
            "wav_to_token_ratio": cfg.wav_to_token_ratio}


def build(cfg, state: Dict[str, torch.Tensor], device="cpu"):
    """nemo's ``RVQVAEModel`` with our nemo-layout decoder weights (its encoder keeps its own init)."""
    from omegaconf import DictConfig
    m = module().RVQVAEModel(DictConfig(config_dict(cfg)))
    missing, unexpected = m.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(("encoder.", "prvq._variance_list")) for k in missing):
        raise RuntimeError(f"stock codec does not take these weights: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    return m.to(device).eval()


@torch.no_grad()
def cached_decode(codec, codes: torch.Tensor) -> torch.Tensor:
    """NVIDIA's serving loop: one frame per call through a ``CausalConv1dCache``; codes [K, N] -> [N * ratio]."""
    cache = module().CausalConv1dCache()
    out: List[torch.Tensor] = []
    for t in range(codes.shape[1]):
        wav, _ = codec.decode(codes.t()[None, t:t + 1], cache=cache)
        out.append(wav.reshape(-1))
    return torch.cat(out)
