"""What ``duplexcadence-bench session`` reports: the tables it prints, the bit-identity lines and ``bench.json``.

:class:`Runs` holds every run of one bench (a key per run, its mode, label and results); :func:`print_report`
prints the tables, the slowest seconds, the accounting and where runs differ; :func:`write_report` writes
``bench.json`` (with its provenance), ``bench.md`` and ``bench.png`` into ``--out``. The runs themselves are
:mod:`engine.bench.session`'s.
"""
from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from engine.bench import accounting, memory_map, report
from engine.bench.digests import describe, divergence
from engine.session.records import DEADLINE_MS
from engine.stats import MIB, table


@dataclass
class Runs:
    """One bench's runs: ``keys`` (a mode's name, ``graphs-2`` for its second run), their ``modes``, and per key
    its results (:func:`engine.bench.session.run_mode`) and label; ``rows``: label -> summary; ``accounts``: label
    -> per-second accounting, where counted."""

    keys: List[str]
    modes: List[str]
    results: Dict[str, Dict[str, object]] = field(default_factory=dict)
    labels: Dict[str, str] = field(default_factory=dict)
    rows: Dict[str, Dict[str, object]] = field(default_factory=dict)
    accounts: Dict[str, Dict[str, object]] = field(default_factory=dict)


@dataclass
class Outcome:
    """What the runs show together: each against the reference, the flip run, and where bits part."""

    identical: Dict[str, bool]
    flip: Optional[bool]
    n_flip: int
    seconds: int
    where: Dict[str, object]
    where_lines: List[str]
    same: str


def slowest_second(run: Dict[str, object]) -> Dict[str, object]:
    """A run's (:func:`run_mode`) slowest second: its index, decision, stage times, captures and GC time."""
    recs = run["records"]
    k = max(range(len(recs)), key=lambda i: recs[i].total_ms)
    x = recs[k]
    return {"index": k, "decision": x.decision, "total_ms": x.total_ms, "listen_ms": x.listen_ms,
            "think_ms": x.think_ms, "think_tts_ms": x.think_tts_ms, "speak_ms": x.speak_ms,
            "captures": run["captures"][k], "gc_ms": run["gc_ms"][k]}


def format_slowest(name: str, w: Dict[str, object]) -> str:
    return (f"{name}, slowest second: {w['index']} ({w['decision']}) {w['total_ms']:.1f} ms = LISTEN "
            f"{w['listen_ms']:.1f} + THINK {w['think_ms']:.1f} (TTS {w.get('think_tts_ms', 0.0):.1f}) + SPEAK "
            f"{w['speak_ms']:.1f}; graphs captured in it: "
            f"{w['captures']}; garbage collection: {w['gc_ms']:.1f} ms")


def stage_table(rows: Dict[str, Dict[str, object]], wrap: bool = True) -> str:
    """Per mode: p50 / p99 / max of the second's total, misses, stage medians, state and reserved memory."""
    heads = ["mode", "p50 ms", "p99 ms", "max ms", "misses", "p50 listen", "p50 think", "p50 speak",
             "state MiB", "reserved MiB"]
    body = [[name, f"{s['p50_total_ms']:.1f}", f"{s['p99_total_ms']:.1f}", f"{s['max_total_ms']:.1f}", s["misses"],
             f"{s['p50_listen_ms']:.1f}", f"{s['p50_think_ms']:.1f}", f"{s['p50_speak_ms']:.1f}",
             f"{s['state_bytes'] / MIB:.1f}", f"{s['max_reserved_bytes'] / MIB:.1f}"] for name, s in rows.items()]
    return table(body, heads, max_widths=[20] + [None] * 9, header_width=8, wrap=wrap)


def means_table(rows: Dict[str, Dict[str, object]], wrap: bool = True) -> str:
    """Per mode: mean second, mean speaking / listening second, and the stages of a mean speaking second."""
    heads = ["mode", "mean ms", "mean speaking", "mean listening", "speaking: listen", "speaking: think",
             "of which TTS", "speaking: speak", "mean ahead", "max with ahead"]
    body = [[name, f"{s['mean_total_ms']:.1f}", f"{s['mean_speaking_second_ms']:.1f}",
             f"{s['mean_listening_second_ms']:.1f}", f"{s['mean_listen_ms_speaking']:.1f}",
             f"{s['mean_think_ms_speaking']:.1f}", f"{s.get('mean_think_tts_ms_speaking', 0.0):.1f}",
             f"{s['mean_speak_ms_speaking']:.1f}",
             f"{s.get('mean_ahead_ms', 0.0):.1f}", f"{s.get('max_second_with_ahead_ms', 0.0):.1f}"]
            for name, s in rows.items()]
    return table(body, heads, max_widths=[16] + [None] * 9, header_width=9, wrap=wrap)


def mode_doc(name: str, run: Dict[str, object]) -> Dict[str, object]:
    """A mode's entry in bench.json: its label, its summary and (when counted) its ``accounting``."""
    doc = {"label": name, **run["summary"]}
    if "accounting" in run:
        doc["accounting"] = run["accounting"]
    if run["records"]:
        doc["slowest_second"] = slowest_second(run)
        doc["gc_ms_per_second"] = [round(x, 3) for x in run["gc_ms"]]
    return doc


def identical_to_reference(keys: List[str], audio: Dict[str, np.ndarray]) -> Dict[str, bool]:
    """Each run after the first against the first (the reference), sample for sample. The reference is
    never compared with itself: with one run the answer is empty (reported as n/a)."""
    return {key: bool(np.array_equal(audio[keys[0]], audio[key])) for key in keys[1:]}


def same_line(identical: Dict[str, bool], labels: Dict[str, str], ref: str, flip: Optional[bool],
              flip_n: int, seconds: int) -> str:
    """The bit-identity sentence: the distinct runs against the reference, then the flip run and what it covered."""
    if identical:
        runs = (f"outputs bit-identical to the reference ({labels[ref]}): {all(identical.values())} "
                f"({', '.join(f'{labels[k]}: {v}' for k, v in identical.items())})")
    else:
        runs = f"outputs bit-identical across modes: n/a (one run, {labels[ref]}; nothing to compare with)"
    if flip is None:
        return f"{runs}; toggles flipped every second: not run"
    span = f"all {seconds} s" if flip_n == seconds else f"the first {flip_n} of {seconds} s only"
    return f"{runs}; toggles flipped every second ({span}): {flip}"


def divergences(keys: List[str], modes: List[str], results: Dict[str, Dict[str, object]], labels: Dict[str, str],
                flip: Optional[Dict[str, object]]) -> Tuple[Dict[str, object], List[str]]:
    """Each run against the first (a repeat also against its mode's first run; the flip run against the
    first run's same seconds): the JSON entry and one terminal line each."""
    ref = keys[0]
    doc: Dict[str, object] = {}
    lines: List[str] = []
    first_of: Dict[str, str] = {}
    for key, m in zip(keys, modes):
        first_of.setdefault(m, key)
        if key != ref:
            d = divergence(results[ref]["digests"], results[key]["digests"])
            doc[key] = d
            lines.append(describe(labels[key], labels[ref], d))
        if first_of[m] != key and first_of[m] != ref:
            d = divergence(results[first_of[m]]["digests"], results[key]["digests"])
            doc[f"{key} vs {first_of[m]}"] = d
            lines.append(describe(labels[key], labels[first_of[m]], d))
    if flip is not None:
        d = divergence(results[ref]["digests"], flip["digests"])
        doc["toggles flipped"] = d
        lines.append(describe("toggles flipped", labels[ref], d))
    return doc, lines


def outcome(runs: Runs, flip_run: Optional[Dict[str, object]], n_flip: int, seconds: int, digests: bool) -> Outcome:
    """Each run against the first, the flip run against the first run's seconds, and where bits part."""
    ref = runs.results[runs.keys[0]]["audio"]
    identical = identical_to_reference(runs.keys, {key: r["audio"] for key, r in runs.results.items()})
    flip = None if flip_run is None else bool(np.array_equal(ref[: n_flip * 24000], flip_run["audio"]))
    where, lines = (divergences(runs.keys, runs.modes, runs.results, runs.labels, flip_run) if digests
                    else ({}, []))
    same = same_line(identical, runs.labels, runs.keys[0], flip, n_flip, seconds)
    return Outcome(identical, flip, n_flip, seconds, where, lines, same)


def title(runs: Runs, seconds: int) -> str:
    info = runs.results[runs.keys[0]]["summary"]["info"]
    return f"duplex session: {info['tail_title']} <- {info['backbone_title']}, {info['device']}, {seconds} s of input"


def print_report(runs: Runs, out: Outcome, cuda: bool) -> None:
    """The report on stdout: title, fast paths, the tables, slowest seconds, accounting, memory, bit identity."""
    info = runs.results[runs.keys[0]]["summary"]["info"]
    print(textwrap.fill(title(runs, out.seconds), 120))
    for line in info.get("fast_paths", []):                  # e.g. MiniCPM-o's fused norm/RoPE: chosen, or why not
        print(textwrap.fill(f"fast path: {line}", 120))
    print(stage_table(runs.rows))
    print(means_table(runs.rows))
    for key in runs.keys:
        if runs.results[key]["records"]:
            print(textwrap.fill(format_slowest(runs.labels[key], slowest_second(runs.results[key])), 120))
    if runs.accounts:
        for text in (accounting.format_table(runs.accounts), accounting.format_kernels(runs.accounts),
                     accounting.format_sites(runs.accounts)):
            if text:
                print(text)
        print(textwrap.fill(accounting.note(cuda), 120))
    for key in runs.keys:
        summ = runs.results[key]["summary"]
        mem = memory_map.format_map(runs.labels[key], summ.get("memory_map"))
        if mem:
            print(mem)
            print(f"  peak reserved from the end of the build on (inside seconds too): "
                  f"{summ['peak_reserved_bytes'] / MIB:,.0f} MiB (the most held at a second's end: "
                  f"{summ['max_reserved_bytes'] / MIB:,.0f} MiB)")
    print(textwrap.fill(out.same, 120))
    for line in out.where_lines:
        print(textwrap.fill(line, 120, subsequent_indent="  "))


def _markdown(runs: Runs, out: Outcome, command: str, cuda: bool) -> str:
    acc = runs.accounts
    sections = [("per second", stage_table(runs.rows, wrap=False)), ("means", means_table(runs.rows, wrap=False))]
    extra = [("per-second accounting", accounting.format_table(acc, wrap=False) if acc else ""),
             ("where the kernel time goes", accounting.format_kernels(acc, wrap=False) if acc else ""),
             ("where the host operators come from", accounting.format_sites(acc, wrap=False) if acc else "")]
    notes = [out.same] + out.where_lines + ([accounting.note(cuda)] if acc else [])
    return report.markdown(title(runs, out.seconds), command, sections + [x for x in extra if x[1]], notes)


def write_report(folder: Path, doc: Dict[str, object], runs: Runs, out: Outcome, command: str, cuda: bool) -> int:
    """``bench.json`` (``doc`` and each run's entry, with the provenance), ``bench.md`` and ``bench.png`` in
    ``folder``; 0, or 1 after one error line when they cannot be written."""
    doc = {**doc, "modes": {key: mode_doc(runs.labels[key], runs.results[key]) for key in runs.keys},
           "identical": out.identical if out.identical else "n/a", "flip_identical": out.flip,
           "flip_seconds": out.n_flip if out.flip is not None else 0, "divergence": out.where,
           "deadline_ms": DEADLINE_MS}
    per_second = {runs.labels[key]: [rec.total_ms for rec in runs.results[key]["records"]] for key in runs.keys}
    fig = report.Figure([
        report.Lines("ms per second of the session", "second", "ms", per_second,
                     hline=(float(DEADLINE_MS), "deadline")),
        report.Bars("median ms per stage", "ms", list(runs.rows),
                    {st: [s[f"p50_{st}_ms"] for s in runs.rows.values()] for st in ("listen", "think", "speak")})])
    try:
        report.write_all(folder / "bench.json", doc, _markdown(runs, out, command, cuda), fig, command=command)
    except OSError as e:
        print(f"duplexcadence-bench session: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {folder / 'bench.json'}, bench.md, bench.png and each mode's records", file=sys.stderr)
    return 0
