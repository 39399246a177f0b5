"""Read back an exported session folder (what File → Open session… shows). No Qt here.

An export holds ``STEM.jsonl`` (one record per second; ``STEM.csv`` is read when the JSON Lines
file is missing), ``STEM.trace.json`` (its ``otherData`` is the session's info: model titles,
device, size; where it lacks them, as older ``duplexcadence run`` logs do, they come from its ``config`` or
the records) and ``STEM_input.wav`` / ``STEM_output.wav``. Only the records are required; a
folder without them, or a damaged line, is one :class:`ReplayError` naming the file.
"""
from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from engine import registry
from engine.session import SecondRecord
from engine.wavio import WavError, read_wav

#: the fields a row needs for the plots
REQUIRED = ("index", "listen_ms", "think_ms", "speak_ms", "total_ms", "missed", "state_bytes")


class ReplayError(ValueError):
    """A folder that is not a readable session export (the message names the file and why)."""


@dataclass
class LoadedSession:
    """One exported session: its per-second rows, its info and (when present) its audio."""
    folder: Path
    rows: List[dict]
    info: Dict[str, object] = field(default_factory=dict)
    input_audio: Optional[Tuple[np.ndarray, int]] = None      # ([N], rate)
    output_audio: Optional[Tuple[np.ndarray, int]] = None

    @property
    def title(self) -> str:
        """A short name: the folder, and the model/toggles it ran with."""
        info = self.info
        parts = [self.folder.name]
        if info.get("tail_title") or info.get("backbone_title"):
            parts.append(f"{info.get('tail_title', '?')} · {info.get('backbone_title', '?')}")
        if self.rows:
            r = self.rows[-1]
            mode = "+".join(n for n, k in (("demand", "demand_sized"), ("graphs", "graph_replay")) if r.get(k))
            parts.append(f"{mode or 'stock-like'} on {info.get('device', '?')}")
        return " — ".join(parts)


_TYPES = {f.name: f.type for f in dataclasses.fields(SecondRecord)}


def _typed(row: Dict[str, str]) -> dict:
    """A CSV row (all strings) with the record's types: bools, ints, floats, strings."""
    out = {}
    for k, v in row.items():
        t = str(_TYPES.get(k, "str"))
        if t == "bool":
            out[k] = v.strip().lower() in ("true", "1")
        elif t == "int":
            out[k] = int(float(v))
        elif t == "float":
            out[k] = float(v)
        else:
            out[k] = v
    return out


def _find(folder: Path, suffix: str) -> Optional[Path]:
    """``session<suffix>`` if present, else the only file ending in ``suffix``."""
    preferred = folder / f"session{suffix}"
    if preferred.is_file():
        return preferred
    found = sorted(p for p in folder.glob(f"*{suffix}") if p.is_file())
    return found[0] if len(found) == 1 else None


def _read_rows(folder: Path) -> List[dict]:
    path = _find(folder, ".jsonl")
    rows: List[dict] = []
    try:
        if path is not None:
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ReplayError(f"{path}: line {n} is not JSON ({e.msg})") from None
        else:
            path = _find(folder, ".csv")
            if path is None:
                raise ReplayError(f"{folder} is not a session export: it has no session.jsonl or session.csv")
            with open(path, newline="", encoding="utf-8") as f:
                for n, row in enumerate(csv.DictReader(f), start=2):
                    try:
                        rows.append(_typed(row))
                    except (TypeError, ValueError, AttributeError):
                        raise ReplayError(f"{path}: line {n} has a value that is not a number") from None
    except OSError as e:
        raise ReplayError(f"cannot read {path}: {e.strerror or e}") from None
    for n, row in enumerate(rows, start=1):
        missing = [k for k in REQUIRED if not isinstance(row, dict) or k not in row]
        if missing:
            raise ReplayError(f"{path}: record {n} lacks {', '.join(missing)}")
    if not rows:
        raise ReplayError(f"{path} holds no seconds")
    return rows


def _read_info(folder: Path, stem: str, rows: List[dict]) -> Dict[str, object]:
    path = folder / f"{stem}.trace.json"
    try:
        other = json.loads(path.read_text(encoding="utf-8")).get("otherData", {})
    except (OSError, ValueError, AttributeError):
        other = {}                    # the trace is optional: the model is then named from the records
    return _with_model(other if isinstance(other, dict) else {}, rows)


def _title_of(kind: str, name: str) -> str:
    try:
        return (registry.get_tail if kind == "tail" else registry.get_backbone)(name).title
    except (KeyError, ValueError):
        return name                   # a part this build does not know: its name


def _with_model(info: Dict[str, object], rows: List[dict]) -> Dict[str, object]:
    """``info`` with the model titles, device and size filled where it lacks them: from the run's ``config``
    (a ``duplexcadence run`` log holds only that), else from the records' tail and backbone names."""
    cfg = info.get("config") if isinstance(info.get("config"), dict) else {}
    first = rows[0] if rows else {}
    out = dict(info)
    for kind in ("tail", "backbone"):
        name = cfg.get(kind) or first.get(kind)
        if not out.get(f"{kind}_title") and isinstance(name, str) and name:
            out[f"{kind}_title"] = _title_of(kind, name)
    for key in ("device", "size"):
        if not out.get(key) and isinstance(cfg.get(key), str):
            out[key] = cfg[key]
    return out


def _read_audio(path: Path) -> Optional[Tuple[np.ndarray, int]]:
    if not path.is_file():
        return None
    try:
        x, rate = read_wav(path)
    except (WavError, OSError):
        return None                   # audio is optional too: the plots still show
    x = np.asarray(x, dtype=np.float32)
    return (x.mean(axis=1) if x.ndim == 2 else x), int(rate)


def load_session(folder) -> LoadedSession:
    """Read an exported session folder; raises :class:`ReplayError` with one line."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ReplayError(f"{folder} is not a folder")
    rows = _read_rows(folder)
    jsonl = _find(folder, ".jsonl") or _find(folder, ".csv")
    stem = jsonl.stem if jsonl is not None else "session"
    return LoadedSession(folder, rows, _read_info(folder, stem, rows), _read_audio(folder / f"{stem}_input.wav"),
                         _read_audio(folder / f"{stem}_output.wav"))


def envelope(audio: Optional[Tuple[np.ndarray, int]], columns: int = 2000) -> Tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray]:
    """(t [C] seconds, lo [C], hi [C]): min/max of the whole recording in ``columns`` columns."""
    if audio is None or not len(audio[0]):
        return np.zeros(0), np.zeros(0), np.zeros(0)
    x, rate = audio
    per = max(1, int(np.ceil(len(x) / columns)))
    pad = (-len(x)) % per
    cols = np.pad(x, (0, pad)).reshape(-1, per)                           # [C, per]
    t = np.arange(len(cols)) * per / float(rate)
    return t, cols.min(axis=1), cols.max(axis=1)
