"""Cheap checks of checkpoint files by their contents (headers only), for the decoders' ``resolve_checkpoint``.

A folder of junk files with the right names must be refused when it is chosen, not when Start fails
minutes later: these read the safetensors JSON header, the first bytes of a torch file and a YAML
document, without loading any weights. Every failure is a ValueError with one line naming the file.
"""
from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Dict, Iterable, Tuple

from engine import safeload

#: largest safetensors header we read (the released codecs' headers are tens of KiB)
MAX_HEADER = 16 * 1024 * 1024


def existing_folder(path, what: str) -> Path:
    """``path`` as a folder that can be listed and read (one line otherwise, also without permission)."""
    return safeload.folder(path, what)


def require_files(folder: Path, names: Iterable[str]) -> None:
    missing = [n for n in names if not safeload.is_file(folder / n)]
    if missing:
        raise ValueError(f"checkpoint folder {folder} lacks {', '.join(missing)}")


#: safetensors dtypes and their sizes in bytes
DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
          "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_NDIM = 8
MAX_EXTENT = 1 << 40


def _entry(p: Path, k: str, v, data_bytes: int) -> Tuple[str, Tuple[int, ...]]:
    """(dtype, shape) of one header entry, checked: known dtype, a list of whole extents, offsets that
    fit the file and match the shape."""
    bad = f"{p} is not a safetensors file (entry {k!r:.60}"
    if not isinstance(v, dict) or "shape" not in v or "dtype" not in v:
        raise ValueError(f"{bad} has no dtype/shape)")
    dtype, shape, offsets = v["dtype"], v["shape"], v.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"{bad} has dtype {dtype!r:.20}, not a safetensors dtype)")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or \
            not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_EXTENT for x in shape):
        raise ValueError(f"{bad} has shape {shape!r:.40}; a shape is a list of at most {MAX_NDIM} whole numbers)")
    if not isinstance(offsets, list) or len(offsets) != 2 or \
            not all(isinstance(x, int) and not isinstance(x, bool) for x in offsets) or \
            not 0 <= offsets[0] <= offsets[1] <= data_bytes:
        raise ValueError(f"{bad} has data_offsets {offsets!r:.40} outside the file's {data_bytes:,} data bytes)")
    if offsets[1] - offsets[0] != math.prod(shape) * DTYPES[dtype]:
        raise ValueError(f"{bad}: its shape {tuple(shape)} does not match its {offsets[1] - offsets[0]:,} bytes)")
    return dtype, tuple(shape)


def safetensors_header(path) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """``{key: (dtype, shape)}`` from a .safetensors file's header, every entry checked against the
    file's size before anything is allocated; ValueError (one line) if it is not one."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{p} is not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n <= 1 or n > MAX_HEADER or n > size - 8:
                raise ValueError(f"{p} is not a safetensors file (header size {n:,})")
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        meta = safeload.parse_json(raw, "its header")
    except safeload.FileCheckError as e:
        raise ValueError(f"{p} is not a safetensors file ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{p} is not a safetensors file (its header is not a table)")
    return {k: _entry(p, k, v, size - 8 - n) for k, v in meta.items() if k != "__metadata__"}


def torch_file(path) -> None:
    """ValueError unless ``path`` starts like a file ``torch.save`` writes (zip archive or legacy pickle)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror or e}") from None
    if head[:4] != b"PK\x03\x04" and head[:1] != b"\x80":
        raise ValueError(f"{p} is not a PyTorch checkpoint (torch.save zip or pickle)")


def yaml_mapping(path) -> dict:
    """A YAML file's top-level mapping through the bounded loader (:func:`engine.safeload.load_yaml`:
    size, depth, aliases, node budget; tags read as plain nodes); ValueError otherwise."""
    doc = safeload.load_yaml(path, "YAML configuration")
    if not isinstance(doc, dict):
        raise ValueError(f"{path} does not hold a YAML mapping")
    return doc
