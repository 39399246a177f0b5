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
from typing import Dict, Iterable, List, Tuple

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
    """ValueError unless ``path`` starts like a file ``torch.save`` writes (zip archive or legacy pickle) and its
    pickle refers to nothing a weights-only load refuses (read as opcodes, never run: a pickle that would call
    ``os.system`` is refused here, when the folder is chosen, not only when it loads)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror or e}") from None
    if head[:4] != b"PK\x03\x04" and head[:1] != b"\x80":
        raise ValueError(f"{p} is not a PyTorch checkpoint (torch.save zip or pickle)")
    found = pickled_code(p, zipped=head[:4] == b"PK\x03\x04")
    if found:
        raise ValueError(f"{p} holds pickled code or objects other than tensors ({', '.join(found[:3])}): refused "
                         f"(only a plain state dict of tensors is loaded)")


#: what a weights-only load of a plain state dict refers to beyond ``torch`` itself (module -> names)
_PICKLE_ALLOWED = {"collections": {"OrderedDict"}, "_codecs": {"encode"},
                   "builtins": {"set", "frozenset", "bytearray", "slice", "complex"},
                   "__builtin__": {"set", "frozenset", "bytearray", "slice", "complex"}}
_PICKLE_CAP = 256 << 20
_PICKLES = 5                 # a legacy torch file: magic, protocol, sys info, the data, the storage keys


def pickled_code(p: Path, zipped: bool) -> List[str]:
    """The globals a torch file's pickle refers to that a weights-only load would refuse (none run)."""
    if zipped:
        try:
            import torch
            return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(p)))
        except Exception as e:                         # noqa: BLE001 - a broken archive: one line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"{p} is not a readable PyTorch checkpoint ({first[:200]})") from None
    import io
    try:
        with open(p, "rb") as f:
            data = io.BytesIO(f.read(_PICKLE_CAP))
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror or e}") from None
    found: List[str] = []
    for _ in range(_PICKLES):
        if data.tell() >= len(data.getbuffer()):
            break
        try:
            found += [g for g in _globals_of(data) if not _allowed(g)]
        except Exception:                              # noqa: BLE001 - raw storage bytes after the pickles
            break
    return list(dict.fromkeys(found))


def _allowed(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    return module == "torch" or module.startswith("torch.") or attr in _PICKLE_ALLOWED.get(module, ())


def _globals_of(data) -> List[str]:
    """``module.name`` of every global one pickle (read from ``data`` up to its STOP) refers to: the names
    ``STACK_GLOBAL`` takes are followed through the memo and the stack's last pushes ("(hidden)" otherwise)."""
    import pickletools
    out, recent, memo = [], [], {}
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            out.append(".".join(str(arg).split(" ", 1)))
        elif op.name == "STACK_GLOBAL":
            out.append(".".join(recent[-2:]) if len(recent) >= 2 and None not in recent[-2:] else "(hidden)")
        elif op.name in ("EXT1", "EXT2", "EXT4"):
            out.append(f"(extension {arg})")
        elif op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            memo[len(memo) if op.name == "MEMOIZE" else arg] = recent[-1] if recent else None
        elif op.name in ("GET", "BINGET", "LONG_BINGET"):
            recent.append(memo.get(arg))
        elif op.name == "POP" and recent:
            recent.pop()
        elif op.name == "DUP":
            recent.append(recent[-1] if recent else None)
        elif "UNICODE" in op.name or op.name in ("STRING", "BINSTRING", "SHORT_BINSTRING"):
            recent.append(str(arg))
        elif op.stack_after:
            recent.append(None)
        if op.name == "STOP":
            break
    return out


def yaml_mapping(path) -> dict:
    """A YAML file's top-level mapping through the bounded loader (:func:`engine.safeload.load_yaml`:
    size, depth, aliases, node budget; tags read as plain nodes); ValueError otherwise."""
    doc = safeload.load_yaml(path, "YAML configuration")
    if not isinstance(doc, dict):
        raise ValueError(f"{path} does not hold a YAML mapping")
    return doc
