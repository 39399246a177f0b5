"""README: every performance number stands next to the docs/ JSON it was read from, and that JSON's command.

A *block* is a table row, a list item or a paragraph (fenced code is skipped). Checked: every number with a unit
(ms, MiB/GiB/MB/GB, %, min, an ``x`` ratio, sessions, misses) in the performance sections (:data:`PERF_SECTIONS`),
and the timings, ratios and session counts of any other block that speaks of the H200. Such a block must link a
``docs/**/*.json`` that exists; its ms and MiB/GiB/MB numbers must be values of that JSON as shown (rounded to the digits printed;
byte counts read as MiB or GiB), so a number typed by hand or from another run fails. Every JSON the README links
must be listed with the command that wrote it. Dates, versions, rates and file sizes elsewhere are not checked.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PERF_SECTIONS = ("Measured on an H200", "Packaging")
UNIT = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?:\s?(ms|MiB|GiB|MB|GB|%|min)\b|(x)\b|\s+(sessions?|misses)\b)")
JSON_PATH = re.compile(r"docs/[\w./-]+?\.json")
COMMAND = re.compile(r"`[^`]*(?:duplexcadence-bench|engine\.bench\.cli|make package|packaging/build\.sh)[^`]*`")
FROM_JSON_UNITS = {"ms": 1.0, "MiB": float(1 << 20), "GiB": float(1 << 30), "MB": 1e6, "GB": 1e9}

Block = Tuple[str, int, str]            # (section heading, first line number, text)


def blocks(text: str) -> Iterator[Block]:
    """The README's table rows, list items and paragraphs, each with its ``## `` section; code fences skipped."""
    section, start, lines, fenced = "", 0, [], False

    def flush():
        if lines:
            yield section, start, "\n".join(lines)
        lines.clear()

    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            yield from flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        stripped = line.strip()
        if line.startswith("#"):
            yield from flush()
            if line.startswith("## "):
                section = line[3:].strip()
            continue
        if not stripped or stripped.startswith("|") or re.match(r"[-*] |\d+\. ", stripped):
            yield from flush()
        if stripped:
            if not lines:
                start = n
            lines.append(line)
            if stripped.startswith("|"):
                yield from flush()
    yield from flush()


def measured(block: Block, numbers: List[tuple]) -> List[tuple]:
    """The numbers of ``block`` the rule covers: all of a performance section's; elsewhere the timings, ratios and
    session counts of a block that speaks of the H200 (sizes there are of files and configs, not measurements)."""
    section, _, text = block
    if section.startswith(PERF_SECTIONS):
        return numbers
    if "H200" not in text:
        return []
    return [n for n in numbers if n[1] in ("ms", "%", "min") or n[2] or n[3]]


def numeric_leaves(value) -> Iterator[Tuple[str, float]]:
    """(key, number) for every number in a JSON document (nested dicts and lists; numbers inside strings too)."""
    stack = [("", value)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.items())
        elif isinstance(v, list):
            stack.extend((key, x) for x in v)
        elif isinstance(v, bool):
            continue
        elif isinstance(v, (int, float)):
            yield key, float(v)
        elif isinstance(v, str):
            yield from ((key, float(m)) for m in re.findall(r"\d+(?:\.\d+)?", v))


def candidates(paths: List[str], unit: str) -> List[float]:
    """The values of those JSONs a number in ``unit`` may show (byte counts converted to the unit)."""
    out = []
    for path in paths:
        for key, v in numeric_leaves(json.loads((ROOT / path).read_text())):
            out.append(v / FROM_JSON_UNITS[unit] if key.endswith("bytes") else v)
    return out


def shown_as(value: float, shown: str) -> bool:
    digits = len(shown.split(".")[1]) if "." in shown else 0
    return abs(value - float(shown.replace(",", ""))) <= 0.5 * 10 ** -digits + 1e-9


def problems(text: str) -> List[str]:
    """Every way ``text`` (a README) breaks the rule, one line each."""
    out = []
    for block in blocks(text):
        section, line, body = block
        numbers = measured(block, UNIT.findall(body))
        if not numbers:
            continue
        linked = sorted(set(JSON_PATH.findall(body)))
        missing = [p for p in linked if not (ROOT / p).is_file()]
        if missing:
            out.append(f"README.md:{line}: links {', '.join(missing)}, which does not exist")
            continue
        if not linked:
            shown = ", ".join("".join(x) for x in numbers[:4])
            out.append(f"README.md:{line} ({section}): {shown} without a docs/**/*.json link in the same block")
            continue
        for value, unit, *_ in numbers:
            if unit in FROM_JSON_UNITS and not any(shown_as(v, value) for v in candidates(linked, unit)):
                out.append(f"README.md:{line}: {value} {unit} is not a value of {', '.join(linked)}")
    listed = {p for ln in text.splitlines() if COMMAND.search(ln) for p in JSON_PATH.findall(ln)}
    for path in sorted(set(JSON_PATH.findall(text)) - listed):
        out.append(f"README.md: {path} is linked but not listed with the command that wrote it")
    return out


def test_every_performance_number_links_its_json_and_command():
    found = problems(README.read_text())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("planted, expected", [
    ("| Mimi, 1 s of audio | moshi 22.5 ms | **3.1 ms** (7.2x) | |\n", "without a docs/**/*.json link"),
    ("| Mimi, 1 s of audio ([JSON](docs/bench/mimi-h200.json)) | moshi 22.5 ms | **3.1 ms** | |\n",
     "3.1 ms is not a value of docs/bench/mimi-h200.json"),
    ("| Mimi ([JSON](docs/bench/nothing-here.json)) | 22.5 ms | | |\n", "which does not exist"),
    ("Also measured on the H200: 4 sessions ([JSON](docs/bench/nothing-here.json)).\n", "which does not exist"),
])
def test_the_check_finds_a_number_without_its_json(planted, expected):
    """The rule bites: each planted row or line is reported (a row from another run, a typed number, no link)."""
    text = README.read_text()
    at = text.index("| Step-Audio2 token2wav")
    found = problems(text[:at] + planted + text[at:])
    assert any(expected in line for line in found), found


def test_numbers_outside_the_performance_sections_are_not_checked():
    text = "## Setup\n\nThe window shrinks to 900 x 600; the file is about 44 GB; fsync every 5 s.\n"
    assert problems(text) == []
