"""The Moshi weights folder: what it must hold, checked without importing moshi.

The layout is the one Kyutai publishes (a snapshot of e.g. ``kyutai/moshiko-pytorch-bf16`` works
as it is):

* ``model.safetensors`` — the LM (Helium temporal transformer + depformer);
* ``tokenizer-e351c8d8-checkpoint125.safetensors`` — Mimi (its encoder is LISTEN's);
* ``tokenizer_spm_32k_3.model`` — the text tokenizer (optional here: it only turns Moshi's text
  stream into the record's ``text``; needs ``sentencepiece``);
* ``config.json`` — optional: the LM's constructor arguments plus ``moshi_name``, ``mimi_name``,
  ``tokenizer_name``, ``mimi_config_name`` (a JSON file of Mimi's config), ``lm_gen_config``
  (sampling: ``temp``, ``temp_text``, ``top_k``, ``top_k_text``). Without it moshi's defaults
  (Moshi 7B) apply. Weight files it names must be ``.safetensors`` inside the folder: moshi would
  load a ``.pt`` with ``torch.load`` without ``weights_only``, running any pickled code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from engine import safeload

MOSHI_NAME = "model.safetensors"
MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_NAME = "tokenizer_spm_32k_3.model"
#: weight files the adapter lets moshi load (never pickles)
WEIGHT_SUFFIXES = (".safetensors",)


@dataclass
class MoshiFiles:
    folder: Path
    lm: Path
    mimi: Path
    tokenizer: Optional[Path]
    lm_config: Optional[dict]            # LM constructor kwargs (None: moshi's defaults)
    mimi_config: Optional[dict]          # Mimi config (None: moshi's defaults, the released Mimi)
    lm_gen_config: dict = field(default_factory=dict)

    @property
    def standard_mimi(self) -> bool:
        """Whether Mimi has the released configuration (then our Mimi decoder can load it too)."""
        return self.mimi_config is None


def _read_json(path: Path, what: str) -> dict:
    """The bounded JSON loader's reading (size, depth, digits, finite numbers; engine/safeload.py)."""
    try:
        return safeload.load_json(path, what)
    except safeload.FileCheckError as e:
        raise ValueError(str(e).replace(" is not valid JSON", " is not readable JSON", 1)) from None


def _need(folder: Path, name, what: str, safetensors: bool = False) -> Path:
    """``folder / name``, which must be a regular file inside ``folder``; ``safetensors``: weights
    must be a ``.safetensors`` file (moshi loads any other name with ``torch.load`` and no
    ``weights_only``, which runs whatever code a pickle carries)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"config.json in {folder}: the file name for {what} must be a string, got {name!r:.40}")
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ValueError(f"config.json in {folder}: {what} must be a file inside the folder, got {name!r}")
    p = safeload.inside(folder, name, f"config.json in {folder}")
    if safetensors and p.suffix.lower() not in WEIGHT_SUFFIXES:
        raise ValueError(f"config.json in {folder} names {name} for {what}: only .safetensors weights are loaded "
                         f"(a pickled .pt/.bin file can run code when loaded)")
    if not safeload.is_file(p):
        raise ValueError(f"Moshi weights folder {folder} lacks {name} ({what})")
    return p


#: the largest whole number an LM constructor argument may be (widths, cards, layer counts, contexts)
MAX_LM_INT = 1 << 20


def check_lm_config(cfg: dict, where: str) -> None:
    """Types and ranges of the LM's constructor arguments (whole numbers from 0 to MAX_LM_INT, not bools
    where a number belongs; heads dividing the width), and the weights they imply within this machine's
    memory; one ValueError naming ``where`` and the field."""
    for k, v in cfg.items():
        if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= MAX_LM_INT:
            raise ValueError(f"{where}: {k} must be a whole number from 0 to {MAX_LM_INT:,}, found {v!r:.40}")
    i = safeload.integer
    dim, heads = i(cfg, "dim", where, 1, 1 << 15, 4096), i(cfg, "num_heads", where, 1, 256, 32)
    layers = i(cfg, "num_layers", where, 1, 256, 32)
    if dim % heads:
        raise ValueError(f"{where}: num_heads {heads} must divide dim {dim}")
    ddim, dlayers = i(cfg, "depformer_dim", where, 1, 1 << 15, 1024), i(cfg, "depformer_num_layers", where, 1, 256, 6)
    cards = i(cfg, "card", where, 1, MAX_LM_INT, 2048) + i(cfg, "text_card", where, 1, MAX_LM_INT, 32000)
    n_q = i(cfg, "n_q", where, 1, 64, 16)
    weights = 12 * dim * dim * layers + 12 * ddim * ddim * dlayers * n_q + cards * (dim + ddim) * (n_q + 1)
    safeload.check_memory(2 * weights, where, f"an LM of about {weights / 1e9:,.1f} billion weights")


def validate_folder(folder) -> MoshiFiles:
    """Check a Moshi weights folder and name its files; ValueError with one clear message if wrong."""
    if folder is None:
        raise ValueError("the moshi backbone needs its weights folder (model.safetensors, Mimi, text tokenizer)")
    f = safeload.folder(folder, "Moshi weights folder")
    raw = _read_json(f / "config.json", "Moshi config") if safeload.is_file(f / "config.json") else None
    lm_config = dict(raw) if raw is not None else None
    names = {"moshi_name": MOSHI_NAME, "mimi_name": MIMI_NAME, "tokenizer_name": TOKENIZER_NAME,
             "mimi_config_name": None, "lm_gen_config": {}}
    if lm_config is not None:
        for key in list(names):
            names[key] = lm_config.pop(key, names[key])
        for key in ("model_type", "model_id", "lora_name", "tts_config", "stt_config"):
            lm_config.pop(key, None)
        check_lm_config(lm_config, f"{f / 'config.json'}")
    lm = _need(f, names["moshi_name"], "the LM weights", safetensors=True)
    mimi = _need(f, names["mimi_name"], "the Mimi weights", safetensors=True)
    if not isinstance(names["tokenizer_name"], str) or Path(names["tokenizer_name"]).is_absolute() \
            or ".." in Path(names["tokenizer_name"]).parts:
        raise ValueError(f"config.json in {f}: tokenizer_name must be a file name inside the folder")
    tok = f / names["tokenizer_name"]
    mimi_config = None
    if names["mimi_config_name"]:
        mimi_config = _read_json(_need(f, names["mimi_config_name"], "Mimi's config"), "Mimi config")
    gen = names["lm_gen_config"] or {}
    if not isinstance(gen, dict):
        raise ValueError(f"config.json in {f}: lm_gen_config must be an object")
    return MoshiFiles(f, lm, mimi, tok if tok.is_file() else None, lm_config, mimi_config, dict(gen))
