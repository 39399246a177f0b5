"""Where a codec checkpoint's config and weights live, checked by content before anything loads.

Two folder layouts are read:

* a codec folder: ``codec_config.yaml`` (nemo's ``codec_config`` fields, at the top level or under a
  ``codec_config`` key; optional ``sample_rate``, default 22,050) and ``codec.safetensors`` (the
  ``RVQVAEModel`` state dict under nemo's names; encoder keys are ignored);
* the released NVIDIA NemotronLabs VoiceChat folder (Hugging Face ``nvidia/NVIDIA-NemotronLabs-VoiceChat-11B``):
  ``config.json`` is ``NemotronVoiceChat``'s whole config — the codec's fields under
  ``model.speech_generation.model.codec_config``, the agent's sample rate under ``data.target_sample_rate``
  (or ``model.speech_generation.data.target_sample_rate``) — and one ``model.safetensors`` (float32) holds
  every component; the codec sits under ``tts_model.audio_codec.`` (``prvq.*``, ``decoder.*``, ``encoder.*``).
  A re-sharded copy (``model.safetensors.index.json`` + the shards it names) is read the same way.
  Established from NVIDIA's loader (``NemotronVoiceChat._from_pretrained`` / ``init_from_safetensors_ckpt``),
  NVIDIA's TensorRT codec builder and tool converters that read the published files; see the README.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Sequence, Tuple

import torch

from engine import safeload
from engine.models import checkfiles

from .config import LIMITS, CodecConfig, from_mapping
from .weights import decoder_keys

CODEC_FILES = ("codec_config.yaml", "codec.safetensors")
VOICECHAT_CONFIG = "config.json"
VOICECHAT_WEIGHTS = "model.safetensors"                  # the release: one file
VOICECHAT_INDEX = "model.safetensors.index.json"         # a sharded copy
VOICECHAT_PREFIX = "tts_model.audio_codec."
CODEC_CONFIG_PATH = ("model", "speech_generation", "model", "codec_config")
RATE_PATHS = (("data", "target_sample_rate"), ("model", "speech_generation", "data", "target_sample_rate"))
MAX_JSON_BYTES = 32 << 20                                # the released config.json is a few tens of KB


@dataclass(frozen=True)
class CodecSource:
    """A folder's codec: its config, the key prefix in the weight files, and the file holding each
    decoder key (nemo's names, prefix removed)."""

    config: CodecConfig
    prefix: str
    files: Dict[str, Path]


def _layout(folder: Path) -> str:
    if all(safeload.is_file(folder / f) for f in CODEC_FILES):
        return "codec"
    if safeload.is_file(folder / VOICECHAT_CONFIG) and any(safeload.is_file(folder / f)
                                                          for f in (VOICECHAT_WEIGHTS, VOICECHAT_INDEX)):
        return "voicechat"
    raise ValueError(f"checkpoint folder {folder} holds neither {' + '.join(CODEC_FILES)} nor a VoiceChat "
                     f"checkpoint ({VOICECHAT_CONFIG} + {VOICECHAT_WEIGHTS} or {VOICECHAT_INDEX})")


def _json(path: Path) -> Any:
    """The bounded JSON loader's reading (size, depth, digits, finite numbers)."""
    return safeload.load_json(path, "the checkpoint's JSON", MAX_JSON_BYTES, want=None)


def _at(doc: Any, keys: Sequence[str]) -> Any:
    for k in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(k)
    return doc


def _with_rate(cfg: CodecConfig, rate, path: Path) -> CodecConfig:
    if rate is None:
        return cfg
    lo, hi = LIMITS["sample_rate"]
    if isinstance(rate, bool) or not isinstance(rate, int) or not lo <= rate <= hi:
        raise ValueError(f"{path}: sample rate must be a whole number from {lo:,} to {hi:,}, got {rate!r:.40}")
    return replace(cfg, sample_rate=int(rate))


def _codec_folder(folder: Path) -> Tuple[CodecConfig, Dict[str, Path], str]:
    path = folder / "codec_config.yaml"
    doc = checkfiles.yaml_mapping(path)
    fields = doc.get("codec_config", doc)
    cfg = from_mapping(fields, str(path))
    rate = doc.get("sample_rate", fields.get("sample_rate") if isinstance(fields, dict) else None)
    cfg = _with_rate(cfg, rate, path)
    return cfg, {k: folder / "codec.safetensors" for k in decoder_keys(cfg)}, ""


def _shard_of(folder: Path, index: Dict[str, Any], key: str) -> Path:
    name = index.get(key)
    if name is None:
        raise ValueError(f"{folder / VOICECHAT_INDEX} does not list {key}: not this codec's checkpoint")
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise ValueError(f"{folder / VOICECHAT_INDEX}: shard of {key} must be a file name in the folder, got {name!r}")
    return safeload.inside(folder, name, str(folder / VOICECHAT_INDEX))


def _voicechat_folder(folder: Path) -> Tuple[CodecConfig, Dict[str, Path], str]:
    path = folder / VOICECHAT_CONFIG
    doc = _json(path)
    fields = _at(doc, CODEC_CONFIG_PATH)
    if not isinstance(fields, dict):
        raise ValueError(f"{path} has no {'.'.join(CODEC_CONFIG_PATH)}: not a Nemotron VoiceChat config")
    cfg = from_mapping(fields, str(path))
    rates = [r for r in (_at(doc, p) for p in RATE_PATHS) if r is not None]
    cfg = _with_rate(cfg, rates[0] if rates else None, path)
    keys = decoder_keys(cfg)
    if (folder / VOICECHAT_WEIGHTS).is_file():
        return cfg, {k: folder / VOICECHAT_WEIGHTS for k in keys}, VOICECHAT_PREFIX
    index = _at(_json(folder / VOICECHAT_INDEX), ("weight_map",))
    if not isinstance(index, dict):
        raise ValueError(f"{folder / VOICECHAT_INDEX} has no weight_map")
    return cfg, {k: _shard_of(folder, index, VOICECHAT_PREFIX + k) for k in keys}, VOICECHAT_PREFIX


def read_config(folder: Path) -> CodecSource:
    """The codec's config and where each of its decoder's tensors is; ValueError naming the file (also
    when the decoder it implies would not fit in this machine's memory)."""
    cfg, files, prefix = _codec_folder(folder) if _layout(folder) == "codec" else _voicechat_folder(folder)
    need = 4 * sum(math.prod(shape) for shape in decoder_keys(cfg).values())
    safeload.check_memory(3 * need, str(folder), "the codec decoder its configuration describes")
    return CodecSource(cfg, prefix, files)


def _check(src: CodecSource) -> None:
    """Every decoder key at its shape in the header of the file said to hold it (no weights read)."""
    headers: Dict[Path, Dict[str, Tuple[str, Tuple[int, ...]]]] = {}
    bad = []
    for key, shape in decoder_keys(src.config).items():
        f = src.files[key]
        if f not in headers:
            if not safeload.is_file(f):
                raise ValueError(f"{f}, named by {f.parent / VOICECHAT_INDEX}, is missing")
            headers[f] = checkfiles.safetensors_header(f)
        if headers[f].get(src.prefix + key, (None, None))[1] != shape:
            bad.append(key)
    if bad:
        raise ValueError(f"{src.files[bad[0]]} does not hold this codec's decoder: {len(bad)} key(s) missing or "
                         f"mis-shaped, e.g. {src.prefix + bad[0]}")


def resolve(path: str) -> str:
    """The folder, once its config parses and its weight files' headers hold every decoder key at its
    shape (no weights are read)."""
    folder = checkfiles.existing_folder(path, "Nemotron codec checkpoint folder")
    _check(read_config(folder))
    return str(folder)


def load(path: str) -> Tuple[CodecConfig, Dict[str, torch.Tensor]]:
    """The config and the decoder's tensors (nemo names, prefix removed) of a checked folder; only the
    codec's tensors are read from the (44 GB) VoiceChat file."""
    from safetensors import safe_open
    folder = Path(resolve(path))
    src = read_config(folder)
    out: Dict[str, torch.Tensor] = {}
    for f in sorted(set(src.files.values())):
        with safe_open(str(f), framework="pt", device="cpu") as h:
            for k, where in src.files.items():
                if where == f:
                    out[k] = h.get_tensor(src.prefix + k)
    return src.config, out
