"""Cheap checks of checkpoint files by their contents (headers only), for the decoders' ``resolve_checkpoint``.

A folder of junk files with the right names must be refused when it is chosen, not when Start fails
minutes later: these read the safetensors JSON header, the first bytes of a torch file and a YAML
document, without loading any weights. Every failure is a ValueError with one line naming the file.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

#: largest safetensors header we read (the released codecs' headers are tens of KiB)
MAX_HEADER = 64 * 1024 * 1024


def existing_folder(path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ValueError(f"{what} {p} does not exist or is not a folder")
    return p


def require_files(folder: Path, names: Iterable[str]) -> None:
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"checkpoint folder {folder} lacks {', '.join(missing)}")


def safetensors_header(path) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """``{key: (dtype, shape)}`` from a .safetensors file's header; ValueError if it is not one."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{p} is not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n <= 1 or n > MAX_HEADER:
                raise ValueError(f"{p} is not a safetensors file (header size {n})")
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{p} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{p} is not a safetensors file (its header is not a table)")
    out = {}
    for k, v in meta.items():
        if k == "__metadata__":
            continue
        if not isinstance(v, dict) or "shape" not in v or "dtype" not in v:
            raise ValueError(f"{p} is not a safetensors file (entry {k!r} has no dtype/shape)")
        out[k] = (str(v["dtype"]), tuple(int(x) for x in v["shape"]))
    return out


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
    """A YAML file's top-level mapping (safe loader: tags are read as plain nodes); ValueError otherwise."""
    import yaml
    p = Path(path)

    class _Loader(yaml.SafeLoader):
        pass

    def _any_tag(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)
    _Loader.add_multi_constructor("!", _any_tag)
    try:
        doc = yaml.load(p.read_text(encoding="utf-8"), Loader=_Loader)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {p}: {e}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ValueError(f"{p} is not valid YAML{at}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{p} does not hold a YAML mapping")
    return doc


def missing_keys(have: Iterable[str], need: Iterable[str]) -> List[str]:
    have = set(have)
    return [k for k in need if k not in have]
