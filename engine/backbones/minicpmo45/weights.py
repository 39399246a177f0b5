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

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from engine import safeload
from engine.models import checkfiles

from .dims import TOKEN_NAMES, Dims, SpecialTokens, dims_from_config

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_TOKENIZER_BYTES = 24 << 20         # the released tokenizer.json is about 11 MB
MAX_TOKENIZER_VALUES = 1 << 21         # JSON values (Qwen's vocabulary and merges: about 151,000 each)
MAX_TOKEN_ID = 1 << 20
PROBE_TEXT = "Hello, how are you today? 你好"        # encoded and decoded once when the tokenizer is read


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


def _read_json(path: Path, what: str, cap: int = safeload.CAPS["json"]) -> dict:
    """A JSON object through the bounded loader (size, depth, digits, finite numbers)."""
    if not safeload.is_file(path):
        raise ValueError(f"checkpoint folder {path.parent} lacks {path.name} ({what})")
    return safeload.load_json(path, what, cap)


def _tokenizer_text(tok_file: Path) -> str:
    """tokenizer.json's text, refused before the library sees it when it is too large, too deep, or holds
    more values than a tokenizer of this family (a merge bomb); measured on the bytes, not parsed here."""
    raw = safeload.read_capped(tok_file, MAX_TOKENIZER_BYTES, "tokenizer.json")
    safeload.check_json_shape(raw, f"tokenizer.json {tok_file}", max_values=MAX_TOKENIZER_VALUES)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{tok_file} is not UTF-8 text: not a tokenizers library file") from None


def _added_tokens(folder: Path) -> Dict[str, int]:
    """added_tokens.json: an object of token -> id (whole numbers from 0); {} when absent."""
    path = folder / "added_tokens.json"
    if not safeload.is_file(path):
        return {}
    added = _read_json(path, "the added tokens")
    for name, tid in added.items():
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < MAX_TOKEN_ID:
            raise ValueError(f"{path}: the id of {name!r:.40} must be a whole number from 0, found {tid!r:.40}")
    return added


def _tokenizer(folder: Path):
    tok_file = folder / "tokenizer.json"
    if not safeload.is_file(tok_file):
        raise ValueError(f"checkpoint folder {folder} lacks tokenizer.json")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("reading tokenizer.json needs the 'tokenizers' package: "
                         "pip install -e '.[minicpmo]'") from None
    text = _tokenizer_text(tok_file)
    try:
        with safeload.quiet_stderr():
            tok = Tokenizer.from_str(text)
            tok.decode(tok.encode(PROBE_TEXT).ids)          # a normalizer that panics on any text panics here
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:        # noqa: BLE001 — its parse errors, and a panic (pyo3's PanicException)
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise ValueError(f"{tok_file} could not be read as a tokenizer ({reason})") from None
    added = _added_tokens(folder)
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
    if not safeload.is_file(path):
        return ()
    ids = _read_json(path, "the tokenizer configuration").get("bad_token_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{path}: bad_token_ids must be a list of token ids")
    out = [i for i in ids if not 0 <= i < vocab]
    if out:
        raise ValueError(f"{path}: bad_token_ids holds {out[0]}, outside the LLM vocabulary of {vocab}")
    return tuple(sorted(set(ids)))


def _weight_map(folder: Path) -> Dict[str, str]:
    """key -> shard file name; every shard a plain file name in the folder (no absolute path, no ``..``, no
    folder part), a regular file or a link to one wherever it lies (a hub snapshot's files are links into its
    blobs), whose safetensors header is sound (dtypes, shapes and offsets checked against its size)."""
    if safeload.is_file(folder / INDEX):
        wm = _read_json(folder / INDEX, "the shard index", safeload.CAPS["index"]).get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise ValueError(f"{folder / INDEX} has no weight_map")
        if not all(isinstance(v, str) for v in wm.values()):
            raise ValueError(f"{folder / INDEX}: every shard in weight_map must be a file name")
        shards = sorted(set(wm.values()))
        paths = [safeload.inside(folder, s, str(folder / INDEX)) for s in shards]
        missing = [s for s, p in zip(shards, paths) if not safeload.is_file(p)]
        if missing:
            raise ValueError(f"checkpoint folder {folder} lacks shard {missing[0]} (named in {INDEX})")
        for p in paths:
            checkfiles.safetensors_header(p)
        return {str(k): v for k, v in wm.items()}
    if safeload.is_file(folder / SINGLE):
        return {k: SINGLE for k in checkfiles.safetensors_header(folder / SINGLE)}
    raise ValueError(f"checkpoint folder {folder} lacks {INDEX} (or {SINGLE})")


def open_folder(path) -> Folder:
    """Check a released checkpoint folder (config, tokenizer, shard index, shards present)."""
    folder = safeload.folder(path, "MiniCPM-o 4.5 checkpoint folder")
    cfg = _read_json(folder / "config.json", "the model configuration")
    tok, tokens = _tokenizer(folder)
    dims = dims_from_config(cfg, tokens, where=str(folder / "config.json"))
    for field in TOKEN_NAMES:
        if not 0 <= getattr(tokens, field) < min(dims.llm.vocab, dims.tts.text_vocab):
            raise ValueError(f"{folder / 'tokenizer.json'}: token id {getattr(tokens, field)} is outside the "
                             f"LLM vocabulary of {dims.llm.vocab}")
    return Folder(folder, dims, _weight_map(folder), tok, _bad_token_ids(folder, dims.llm.vocab))


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor, dtype: Optional[torch.dtype] = None,
                     device=None) -> torch.Tensor:
    """The weight-normed head's weight ``g * v / |v|`` (rows), computed as the stock computes it: in the model's
    ``dtype`` from ``g`` and ``v`` already cast to it (the demo's ``model.bfloat16()`` casts the two
    parametrization tensors, and the head folds them in bfloat16 at every forward; folding in float32 and
    casting the product gives other bits), and on the ``device`` the model runs on: each row's norm is a
    reduction whose order differs between the CPU and the CUDA kernel (at the released 768-wide rows some rows
    round differently: on the H200 the TTS logits came out one bfloat16 step off in every speaking second)."""
    g, v = g.to(device=device, dtype=dtype), v.to(device=device, dtype=dtype)
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


def _head_weight(sh: _Shards, base: str, like: torch.Tensor) -> torch.Tensor:
    """The code head's weight for the parameter ``like``: folded in its dtype on its device (as the stock)."""
    new_g, new_v = f"{base}.parametrizations.weight.original0", f"{base}.parametrizations.weight.original1"
    if new_g in sh.folder.weight_map:
        return fold_weight_norm(sh.get(new_g), sh.get(new_v), like.dtype, like.device)
    if f"{base}.weight_g" in sh.folder.weight_map:
        return fold_weight_norm(sh.get(f"{base}.weight_g"), sh.get(f"{base}.weight_v"), like.dtype, like.device)
    return sh.get(f"{base}.weight")


def load_module(module: nn.Module, sh: _Shards, prefix: str, rename: Optional[Dict[str, str]] = None) -> None:
    """Fill every parameter of ``module`` from ``prefix + name`` (shapes checked; cast to its dtype)."""
    rename = rename or {}
    with torch.no_grad():
        for name, p in module.named_parameters():
            key = prefix + rename.get(name, name)
            if name == "head_code.0.weight":
                t = _head_weight(sh, prefix + "head_code.0", p)
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
