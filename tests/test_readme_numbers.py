"""README: every performance number stands next to the result JSON it was read from, and that JSON names its run.

A *block* is a table row, a list item or a paragraph (fenced code is skipped). Checked: every number with a unit
(ms, MiB/GiB/MB/GB, %, min, an ``x`` ratio, sessions, misses) in the results section (:data:`PERF_SECTIONS`), and
the timings, ratios and session counts of any other block that speaks of the H200. Such a block must link a
``docs/**/*.json`` that exists; its ms and MiB/GiB/MB numbers must be values of that JSON as shown (rounded to the
digits printed; byte counts read as MiB or GiB; the JSON's ``provenance`` is not a source of numbers), so a number
typed by hand or from another run fails. Each row of the results table also links the section of
docs/benchmarks.md that gives the command that made it, and that section lists the row's JSONs beside a command.
Every result JSON under docs/ records its provenance: commit, device, driver, torch / cuDNN / cuBLAS, command.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
PERF_SECTIONS = ("Results",)
UNIT = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?:\s?(ms|MiB|GiB|MB|GB|%|min)\b|(x)\b|\s+(sessions?|misses)\b)")
JSON_PATH = re.compile(r"docs/[\w./-]+?\.json")
HOW = re.compile(r"docs/benchmarks\.md#([\w-]+)")
COMMAND = re.compile(r"`[^`]*(?:duplexcadence-bench|engine\.bench\.cli|make package|packaging/build\.sh)[^`]*`")
FROM_JSON_UNITS = {"ms": 1.0, "MiB": float(1 << 20), "GiB": float(1 << 30), "MB": 1e6, "GB": 1e9}
PROVENANCE = ("commit", "device", "driver", "torch", "cudnn", "cublas", "command")

Block = Tuple[str, int, str]            # (section heading, first line number, text)


def blocks(text: str) -> Iterator[Block]:
    """The text's table rows, list items and paragraphs, each with its ``## `` section; code fences skipped."""
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
    """The numbers of ``block`` the rule covers: all of a results section's; elsewhere the timings, ratios and
    session counts of a block that speaks of the H200 (sizes there are of files and configs, not measurements)."""
    section, _, text = block
    if section.startswith(PERF_SECTIONS):
        return numbers
    if "H200" not in text:
        return []
    return [n for n in numbers if n[1] in ("ms", "%", "min") or n[2] or n[3]]


def numeric_leaves(value) -> Iterator[Tuple[str, float]]:
    """(key, number) for every number in a JSON document (nested dicts and lists; numbers inside strings too),
    the ``provenance`` object left out (versions and hashes are not measurements)."""
    stack = [("", value)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((k, x) for k, x in v.items() if k != "provenance")
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


def slug(heading: str) -> str:
    """A markdown heading's anchor as GitHub makes it (lower case, punctuation dropped, spaces to hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> Dict[str, str]:
    """Anchor -> the text of that ``##`` / ``###`` section (up to the next heading of any level)."""
    out, anchor = {}, None
    for line in text.splitlines():
        m = re.match(r"#{2,3} (.+)", line)
        if m:
            anchor = slug(m.group(1))
            out[anchor] = ""
        elif anchor is not None:
            out[anchor] += line + "\n"
    return out


def number_problems(text: str) -> List[str]:
    """Every number of ``text`` (a README) that is not a value of the JSON its block links, one line each."""
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
    return out


def command_problems(text: str, bench: str) -> List[str]:
    """Each results row links a docs/benchmarks.md section that exists and lists the row's JSONs by a command."""
    out, where = [], sections(bench)
    for section, line, body in blocks(text):
        if not (section.startswith(PERF_SECTIONS) and body.lstrip().startswith("|") and JSON_PATH.search(body)):
            continue
        hows = HOW.findall(body)
        if not hows:
            out.append(f"README.md:{line}: a result row without its command (a docs/benchmarks.md#... link)")
            continue
        unknown = [a for a in hows if a not in where]
        out += [f"README.md:{line}: docs/benchmarks.md#{a} is not a section of docs/benchmarks.md" for a in unknown]
        told = [where[a] for a in hows if a in where]
        for path in sorted(set(JSON_PATH.findall(body))):
            rel = path[len("docs/"):]
            if told and not any(rel in t and COMMAND.search(t) for t in told):
                links = ", ".join(f"#{a}" for a in hows)
                out.append(f"README.md:{line}: docs/benchmarks.md ({links}) does not list {path} with its command")
    return out


def provenance_problems(paths) -> List[str]:
    """Each result JSON's missing provenance fields, one line per file."""
    out = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        prov = doc.get("provenance") if isinstance(doc, dict) else None
        lacks = [f for f in PROVENANCE if not (isinstance(prov, dict) and prov.get(f))]
        if lacks:
            out.append(f"{Path(path).relative_to(ROOT)}: provenance lacks {', '.join(lacks)}")
    return out


def test_every_performance_number_is_a_value_of_the_json_its_row_links():
    found = number_problems(README.read_text())
    assert not found, "\n".join(found)


def test_every_result_row_links_the_command_that_made_it():
    found = command_problems(README.read_text(), BENCHMARKS.read_text())
    assert not found, "\n".join(found)


def test_every_result_json_records_its_provenance():
    found = provenance_problems(sorted((ROOT / "docs").rglob("*.json")))
    assert not found, "\n".join(found)


ROW = "| Mimi decoder, 1 s of audio | moshi 22.5 ms | **{ours}** | | [JSON]({json}) [how](docs/benchmarks.md#{how}) |\n"


@pytest.mark.parametrize("planted, expected", [
    ("| Mimi, 1 s of audio | moshi 22.5 ms | **3.1 ms** (7.2x) | |\n", "without a docs/**/*.json link"),
    (ROW.format(ours="3.1 ms", json="docs/results/mimi-decoder.json", how="mimi-decoder"),
     "3.1 ms is not a value of docs/results/mimi-decoder.json"),
    (ROW.format(ours="4.2 ms", json="docs/results/nothing-here.json", how="mimi-decoder"), "which does not exist"),
    ("Also measured on the H200: 4 sessions ([JSON](docs/results/nothing-here.json)).\n", "which does not exist"),
])
def test_the_check_finds_a_number_without_its_json(planted, expected):
    """The rule bites: each planted row or line is reported (a typed number, another run's, no link)."""
    text = README.read_text()
    at = text.index("| MiniCPM-o 4.5")
    found = number_problems(text[:at] + planted + text[at:])
    assert any(expected in line for line in found), found


@pytest.mark.parametrize("how, expected", [
    ("no-such-section", "is not a section of docs/benchmarks.md"),
    ("nemotron-codec", "does not list docs/results/mimi-decoder.json with its command"),
])
def test_the_check_finds_a_row_without_its_command(how, expected):
    text = README.read_text()
    at = text.index("| MiniCPM-o 4.5")
    row = ROW.format(ours="4.2 ms", json="docs/results/mimi-decoder.json", how=how)
    found = command_problems(text[:at] + row + text[at:], BENCHMARKS.read_text())
    assert any(expected in line for line in found), found


def test_the_check_finds_a_json_without_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    bare = tmp_path / "r.json"
    bare.write_text(json.dumps({"rows": [1], "provenance": {"commit": "abc", "command": "x"}}))
    assert provenance_problems([bare]) == ["r.json: provenance lacks device, driver, torch, cudnn, cublas"]


def test_numbers_outside_the_results_section_are_not_checked():
    text = "## Setup\n\nThe window shrinks to 900 x 600; the file is about 44 GB; fsync every 5 s.\n"
    assert number_problems(text) == []
