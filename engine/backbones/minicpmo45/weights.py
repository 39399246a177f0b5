"""Weights of MiniCPM-o 4.5: the released checkpoint folder, or seeded random weights at a preset size.

The released folder (the Hugging Face model repository's layout)::

    config.json                       Qwen3 fields + nested audio_config (Whisper) + tts_config
    model.safetensors.index.json      {"weight_map": {key: shard file}}  (or one model.safetensors)
    model-0000N-of-0000M.safetensors
    tokenizer.json, added_tokens.json the Qwen tokenizer with the duplex protocol's tokens
    tokenizer_config.json             (read: its bad_token_ids, which the LLM's sampler never draws)
    assets/token2wav/                 flow.yaml, flow.pt, hift.pt, two ONNX files (the Step-Audio2 tail)
    assets/HT_ref_audio.wav           the default voice

Keys read, by prefix: ``llm.`` (Qwen3), ``apm.`` (Whisper encoder), ``audio_projection_layer.``
(the audio projector), ``tts.`` (``emb_text``, ``emb_code.0``, ``head_code.0`` with weight norm as
``parametrizations.weight.original0/1`` or ``weight_g/weight_v``, ``model.layers.N``,
``model.norm``, ``projector_semantic``). The vision tower (``vpm.``, ``resampler.``), the TTS's
speaker projector and its unused ``model.embed_tokens`` are not read. Every problem is one
``ValueError`` naming the file or key. Nothing is unpickled.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from .dims import TOKEN_NAMES, Dims, SpecialTokens, dims_from_config

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass
class Folder:
    """A checked checkpoint folder: its dims, key -> shard map and tokenizer."""

    path: Path
    dims: Dims
    weight_map: Dict[str, str]
    tokenizer: object                      # tokenizers.Tokenizer
    bad_token_ids: Tuple[int, ...] = ()    # tokenizer_config.json's: never drawn by the LLM's sampler

    @property
    def token2wav(self) -> Optional[Path]:
        p = self.path / "assets" / "token2wav"
        return p if p.is_dir() else None


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ValueError(f"checkpoint folder {path.parent} lacks {path.name} ({what})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _tokenizer(folder: Path):
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        raise ValueError(f"checkpoint folder {folder} lacks tokenizer.json")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("reading tokenizer.json needs the 'tokenizers' package: "
                         "pip install -e '.[minicpmo]'") from None
    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as e:                                     # the library's own parse errors
        raise ValueError(f"{tok_file} could not be read as a tokenizer ({e})") from None
    added = {}
    if (folder / "added_tokens.json").is_file():
        added = _read_json(folder / "added_tokens.json", "the added tokens")
    ids = {}
    for field, name in TOKEN_NAMES.items():
        tid = added.get(name, tok.token_to_id(name))
        if tid is None:
            raise ValueError(f"{tok_file} has no token {name} (the duplex protocol needs it)")
        ids[field] = int(tid)
    return tok, SpecialTokens(**ids)


def _bad_token_ids(folder: Path, vocab: int) -> Tuple[int, ...]:
    """``bad_token_ids`` of tokenizer_config.json (the stock tokenizer's; the duplex sampler forbids them),
    or () when the file or the field is absent."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return ()
    ids = _read_json(path, "the tokenizer configuration").get("bad_token_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{path}: bad_token_ids must be a list of token ids")
    out = [i for i in ids if not 0 <= i < vocab]
    if out:
        raise ValueError(f"{path}: bad_token_ids holds {out[0]}, outside the LLM vocabulary of {vocab}")
    return tuple(sorted(set(ids)))


def _weight_map(folder: Path) -> Dict[str, str]:
    if (folder / INDEX).is_file():
        wm = _read_json(folder / INDEX, "the shard index").get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise ValueError(f"{folder / INDEX} has no weight_map")
        shards = sorted(set(wm.values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ValueError(f"checkpoint folder {folder} lacks shard {missing[0]} (named in {INDEX})")
        return {str(k): str(v) for k, v in wm.items()}
    if (folder / SINGLE).is_file():
        from safetensors import safe_open
        with safe_open(str(folder / SINGLE), framework="pt") as f:
            return {k: SINGLE for k in f.keys()}
    raise ValueError(f"checkpoint folder {folder} lacks {INDEX} (or {SINGLE})")


def open_folder(path) -> Folder:
    """Check a released checkpoint folder (config, tokenizer, shard index, shards present)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"MiniCPM-o 4.5 checkpoint folder {folder} does not exist or is not a folder")
    cfg = _read_json(folder / "config.json", "the model configuration")
    tok, tokens = _tokenizer(folder)
    dims = dims_from_config(cfg, tokens, where=str(folder / "config.json"))
    for field in TOKEN_NAMES:
        if getattr(tokens, field) >= dims.llm.vocab:
            raise ValueError(f"{folder / 'tokenizer.json'}: token id {getattr(tokens, field)} is outside the "
                             f"LLM vocabulary of {dims.llm.vocab}")
    return Folder(folder, dims, _weight_map(folder), tok, _bad_token_ids(folder, dims.llm.vocab))


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The weight-normed head's weight ``g * v / |v|`` (rows), computed as the stock computes it."""
    return torch._weight_norm(v, g, 0)


class _Shards:
    """Lazily opened safetensors shards of one folder."""

    def __init__(self, folder: Folder, device):
        self.folder, self.device = folder, device
        self.open: Dict[str, object] = {}

    def get(self, key: str) -> torch.Tensor:
        shard = self.folder.weight_map.get(key)
        if shard is None:
            raise ValueError(f"checkpoint {self.folder.path} has no key {key!r} (not in {INDEX})")
        if shard not in self.open:
            from safetensors import safe_open
            try:
                self.open[shard] = safe_open(str(self.folder.path / shard), framework="pt", device=str(self.device))
            except Exception as e:
                raise ValueError(f"shard {self.folder.path / shard} could not be read ({e})") from None
        f = self.open[shard]
        if key not in f.keys():
            raise ValueError(f"shard {self.folder.path / shard} lacks key {key!r} (its index names it)")
        return f.get_tensor(key)


def _head_weight(sh: _Shards, base: str) -> torch.Tensor:
    new_g, new_v = f"{base}.parametrizations.weight.original0", f"{base}.parametrizations.weight.original1"
    if new_g in sh.folder.weight_map:
        return fold_weight_norm(sh.get(new_g), sh.get(new_v))
    if f"{base}.weight_g" in sh.folder.weight_map:
        return fold_weight_norm(sh.get(f"{base}.weight_g"), sh.get(f"{base}.weight_v"))
    return sh.get(f"{base}.weight")


def load_module(module: nn.Module, sh: _Shards, prefix: str, rename: Optional[Dict[str, str]] = None) -> None:
    """Fill every parameter of ``module`` from ``prefix + name`` (shapes checked; cast to its dtype)."""
    rename = rename or {}
    with torch.no_grad():
        for name, p in module.named_parameters():
            key = prefix + rename.get(name, name)
            if name == "head_code.0.weight":
                t = _head_weight(sh, prefix + "head_code.0")
            else:
                t = sh.get(key)
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"checkpoint key {key!r} has shape {tuple(t.shape)}; config.json implies "
                                 f"{tuple(p.shape)}")
            p.copy_(t.to(device=p.device, dtype=p.dtype))


@contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build(cls, *args, device, dtype: torch.dtype) -> nn.Module:
    """Construct a module straight at ``device`` / ``dtype`` (an 8B LLM never passes through host memory)."""
    with default_dtype(dtype), torch.device(device):
        return cls(*args)
