"""The Moshi backbone: Kyutai's Moshi LM in front of the Mimi tail.

Registers ``moshi``: it speaks Mimi codes (the ``mimi`` tail) and needs its weights folder, checked by
content here; a folder whose Mimi is the released one also gives the tail its weights at the released
size. The moshi package is imported only when this backbone is built (:mod:`.backbone`).
"""
from pathlib import Path
from typing import Optional

from engine.registry import BackboneEntry, BackboneFolder, register_backbone

from .files import MoshiFiles, validate_folder


def make(fmt, *, size: str, device, seed: int = 0, checkpoint: Optional[str] = None, **_):
    """The Moshi backbone (moshi is imported here, when chosen); the engine toggles do not apply to it."""
    from .backbone import MoshiBackbone
    return MoshiBackbone(fmt, size=size, device=device, seed=seed, checkpoint=checkpoint)


def open_folder(path: Optional[str], size: str) -> BackboneFolder:
    """The weights folder checked by content; the released Mimi in it is the tail's at the released size."""
    files = validate_folder(path)
    tail = str(files.mimi) if files.standard_mimi and size == "released" else None
    return BackboneFolder(str(files.folder), tail_checkpoint=tail)


register_backbone(BackboneEntry(
    name="moshi", title="Moshi", make=make, tails=("mimi",), speaks="Mimi codes", open_folder=open_folder,
    needs_folder=True, folder_hint="Moshi weights folder (model.safetensors, Mimi, tokenizer)",
    owns_folder=lambda path: Path(path).is_dir(), order=10))

__all__ = ["MoshiFiles", "validate_folder", "make", "open_folder"]
