"""The lines of a journal's ``session.jsonl``: each one sealed by its own checksum, each one read on its own.

A line is one JSON object: the second's record (:meth:`SecondRecord.to_dict`), ``journal_at`` (the second's
place in the journal's WAVs, counted from 0) and last ``crc32``, the CRC-32 of the line written without it
(``{...}``) as 8 hex digits. A reader that knows nothing of the seal reads an ordinary JSON Lines file with
two extra keys.

Reading trusts nothing: the file is split at newlines and at NUL bytes (JSON text never holds a raw NUL,
and a crash can leave a block of them where a line was being written), each piece is parsed alone, and a
piece that is too long, nested, not JSON, not a record, or sealed with a wrong checksum costs that piece
only, never the lines after it. A journal whose lines carry no seal (written before the seal existed) is
read by its records' ``index``, which then must rise from line to line.
"""
from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from .records import SecondRecord

#: the longest line read (a record is under 4 KiB; its text and token lists stay far below this)
MAX_LINE = 1 << 20
#: the highest second a line may name (more than a year of seconds: anything beyond is a broken line)
MAX_AT = 1 << 25
_SEAL = re.compile(r', "crc32": "([0-9a-f]{8})"\}$')
_SPLIT = re.compile(rb"[\n\x00]")
_NAMES = frozenset(SecondRecord.columns())


def seal(record: SecondRecord, at: int) -> str:
    """The journal line of ``record``, the ``at``-th second of the journal's audio (no newline)."""
    body = json.dumps({**record.to_dict(), "journal_at": int(at)})
    crc = zlib.crc32(body.encode("utf-8"))
    return f'{body[:-1]}, "crc32": "{crc:08x}"}}'


@dataclass
class Line:
    """One readable line: the record, its place in the audio, its text as written, whether it was sealed."""

    at: int
    record: SecondRecord
    text: str
    sealed: bool


def parse(text: str) -> Optional[Line]:
    """The :class:`Line` of one piece of a journal, or None when it cannot be trusted."""
    if not text or len(text) > MAX_LINE or not text.startswith("{"):
        return None
    m = _SEAL.search(text)
    body = text[:m.start()] + "}" if m else text
    if m and f"{zlib.crc32(body.encode('utf-8')):08x}" != m.group(1):
        return None
    fields = _flat_object(body)
    if fields is None:
        return None
    try:
        record = SecondRecord(**{k: v for k, v in fields.items() if k in _NAMES})
    except (TypeError, ValueError):
        return None
    at = fields.get("journal_at", record.index) if m else record.index
    if not _whole(record.index) or not _whole(at):
        return None
    return Line(int(at), record, text, bool(m))


def _flat_object(body: str) -> Optional[Dict[str, object]]:
    """``body`` parsed when it is one flat JSON object (a nested one is refused before parsing: no
    recursion however deep it claims to go)."""
    if body.count("{") + body.count("[") > 1 and _nested(body):
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _nested(body: str) -> bool:
    """Whether a ``{`` or ``[`` opens outside a string after the first character (a record is flat)."""
    inside = escaped = False
    for i, ch in enumerate(body):
        if inside:
            escaped, inside = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            inside = True
        elif ch in "{[" and i > 0:
            return True
    return False


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_AT


def pieces(path) -> Iterator[bytes]:
    """The pieces of a file between newlines and NUL bytes, read in blocks (a piece longer than
    :data:`MAX_LINE` comes back cut short: :func:`parse` refuses it); none when it is missing, unreadable or
    not a regular file."""
    p = Path(path)
    if not p.is_file():                              # missing, or a FIFO / device / folder: nothing to read
        return
    try:
        f = open(p, "rb")
    except OSError:
        return
    with f:
        rest = b""
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            parts = _SPLIT.split(rest + block)
            rest = parts.pop()
            yield from parts
            if len(rest) > MAX_LINE:
                rest = rest[:MAX_LINE + 1]           # kept too long to parse, bounded in memory
        if rest:
            yield rest


def read_lines(path) -> List[Line]:
    """The trusted lines of a ``session.jsonl``, in the order of their seconds (see :func:`scan`)."""
    return scan(path)[0]


def scan(path, sealed: bool = False) -> Tuple[List[Line], int]:
    """(the trusted lines of a ``session.jsonl`` in the order of their seconds, how many other non-empty
    pieces it held). Sealed lines are trusted by their checksum alone; once the file holds one (or ``sealed``:
    its journal says it wrote sealed lines), an unsealed line is a broken one. Without any seal, a line's
    ``index`` must rise over the line before it."""
    found, pieces_seen = [], 0
    for raw in pieces(path):
        if not raw.strip():
            continue
        pieces_seen += 1
        line = parse(raw.decode("utf-8", errors="replace"))
        if line is not None:
            found.append(line)
    if sealed or any(line.sealed for line in found):
        found = [line for line in found if line.sealed]
    else:
        rising, last = [], -1
        for line in found:
            if line.at > last:
                rising.append(line)
                last = line.at
        found = rising
    by_at: Dict[int, Line] = {}
    for line in found:
        by_at.setdefault(line.at, line)
    return [by_at[k] for k in sorted(by_at)], pieces_seen - len(by_at)
