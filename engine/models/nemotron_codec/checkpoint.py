"""Where a codec checkpoint's config and weights live, checked by content before anything loads.

Two folder layouts are read:

* a codec folder: ``codec_config.yaml`` (nemo's ``codec_config`` fields, at the top level or under a
  ``codec_config`` key; optional ``sample_rate``, default 22,050) and ``codec.safetensors`` (the
  ``RVQVAEModel`` state dict under nemo's names; encoder keys are ignored);
* the released VoiceChat folder as nemo's ``NemotronVoiceChat.from_pretrained`` reads it:
  ``config.json`` (the codec's fields under ``speech_generation.codec_config``, the rate under
  ``data.target_sample_rate``) and ``model.safetensors`` (the codec under ``tts_model.audio_codec.``).
  This follows nemo 3.0.0's loader code; it was not checked against the published files.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Dict, Tuple

import torch

from engine.models import checkfiles

from .config import CodecConfig, from_mapping
from .weights import decoder_keys

CODEC_FILES = ("codec_config.yaml", "codec.safetensors")
VOICECHAT_FILES = ("config.json", "model.safetensors")
VOICECHAT_PREFIX = "tts_model.audio_codec."


def _layout(folder: Path) -> str:
    if all((folder / f).is_file() for f in CODEC_FILES):
        return "codec"
    if all((folder / f).is_file() for f in VOICECHAT_FILES):
        return "voicechat"
    raise ValueError(f"checkpoint folder {folder} holds neither {' + '.join(CODEC_FILES)} nor a VoiceChat "
                     f"checkpoint ({' + '.join(VOICECHAT_FILES)})")


def read_config(folder: Path) -> Tuple[CodecConfig, Path, str]:
    """The codec's config, its weights file and the key prefix there; ValueError naming the file."""
    if _layout(folder) == "codec":
        path = folder / "codec_config.yaml"
        doc = checkfiles.yaml_mapping(path)
        fields = doc.get("codec_config", doc)
        cfg = from_mapping(fields, str(path))
        rate = doc.get("sample_rate", fields.get("sample_rate") if isinstance(fields, dict) else None)
        return _with_rate(cfg, rate, path), folder / "codec.safetensors", ""
    path = folder / "config.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not readable JSON ({e.__class__.__name__})") from None
    gen = doc.get("speech_generation") if isinstance(doc, dict) else None
    if not isinstance(gen, dict) or not isinstance(gen.get("codec_config"), dict):
        raise ValueError(f"{path} has no speech_generation.codec_config: not a Nemotron VoiceChat config")
    cfg = from_mapping(gen["codec_config"], str(path))
    data = doc.get("data") if isinstance(doc.get("data"), dict) else gen.get("data") or {}
    return _with_rate(cfg, data.get("target_sample_rate"), path), folder / "model.safetensors", VOICECHAT_PREFIX


def _with_rate(cfg: CodecConfig, rate, path: Path) -> CodecConfig:
    if rate is None:
        return cfg
    if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
        raise ValueError(f"{path}: sample rate must be a positive integer, got {rate!r}")
    return replace(cfg, sample_rate=int(rate))


def resolve(path: str) -> str:
    """The folder, once its config parses and its weights file's header holds every decoder key at
    its shape (no weights are read)."""
    folder = checkfiles.existing_folder(path, "Nemotron codec checkpoint folder")
    cfg, weights, prefix = read_config(folder)
    have = checkfiles.safetensors_header(weights)
    bad = [k for k, shape in decoder_keys(cfg).items() if have.get(prefix + k, (None, None))[1] != shape]
    if bad:
        raise ValueError(f"{weights} does not hold this codec's decoder: {len(bad)} key(s) missing or "
                         f"mis-shaped, e.g. {prefix + bad[0]}")
    return str(folder)


def load(path: str) -> Tuple[CodecConfig, Dict[str, torch.Tensor]]:
    """The config and the decoder's tensors (nemo names, prefix removed) of a checked folder."""
    from safetensors import safe_open
    folder = Path(resolve(path))
    cfg, weights, prefix = read_config(folder)
    out = {}
    with safe_open(str(weights), framework="pt", device="cpu") as f:
        for k in decoder_keys(cfg):
            out[k] = f.get_tensor(prefix + k)
    return cfg, out
