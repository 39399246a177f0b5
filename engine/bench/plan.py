"""`duplexcadence-bench plan --model NAME`: the planner's view of a model's session.

Prints each model's regions (demand vs stock bytes), timeline and shape signatures as aligned tables that fit
120 columns. With ``--out DIR``: ``DIR/plan.json``, ``DIR/plan.md`` (the same tables) and ``DIR/plan.png``
(demand vs stock bytes per model).
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

from engine.cli.validate import OneLineParser
from engine.bench import report
from engine.core.planner import format_plan
from engine.models import registry
from engine.stats import MIB, progress

PROG = "duplexcadence-bench plan"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="registered model name; omit to plan every registered model")
    p.add_argument("--size", default="released", choices=["released", "tiny"])
    p.add_argument("--steps", type=int, default=None, help="number of steps (default: open-ended live session)")
    p.add_argument("--rows", type=int, default=12, help="timeline rows to print")
    p.add_argument("--json", action="store_true", help="print demand/stock bytes and signatures as JSON")
    p.add_argument("--out", default=None, help="folder for plan.json, plan.md and plan.png")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _heading(e) -> str:
    return textwrap.fill(f"{e.title} [{e.name}] — {e.architecture}", 120, subsequent_indent="  ")


def main(argv) -> int:
    argv = list(argv)
    p = build_parser()
    a = p.parse_args(argv)
    if a.steps is not None and a.steps < 1:
        p.error("--steps must be at least 1")
    try:
        models = [a.model] if a.model else registry.names()
        entries = [registry.get(m) for m in models]
    except KeyError as e:
        p.error(str(e.args[0]))
    docs: List[Dict] = []
    texts: List[str] = []
    with progress(len(entries), desc="planning", unit="model", quiet=a.quiet or a.json or len(entries) < 2) as bar:
        for e in entries:
            kw = {"size": a.size}
            if a.steps is not None:
                kw["steps"] = a.steps
            plan = e.plan(**kw)
            docs.append({"model": e.name, "demand_bytes": plan.demand_bytes(), "stock_bytes": plan.stock_bytes(),
                         "signatures": [s.label for s in plan.signatures]})
            texts.append(_heading(e) + "\n" + format_plan(plan, max_rows=a.rows))
            bar.update()
    if a.json:
        for d in docs:
            print(json.dumps(d))
    else:
        print(("\n\n" + "=" * 100 + "\n\n").join(texts))
    if a.out:
        totals = {d["model"]: (sum(d["demand_bytes"].values()), sum(d["stock_bytes"].values())) for d in docs}
        fig = report.Figure([report.Bars("state bytes per session: demand-sized vs stock", "MiB", list(totals),
                                         {"demand": [t[0] / MIB for t in totals.values()],
                                          "stock": [t[1] / MIB for t in totals.values()]})])
        command = report.command_line(PROG, argv)
        md = report.markdown("Planner: regions, timeline and shape signatures", command,
                             [("", "```\n" + t + "\n```") for t in texts])
        try:
            written = report.write_all(Path(a.out) / "plan.json", {"size": a.size, "models": docs}, md, fig,
                                       command=command)
        except OSError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 1
        print("wrote " + ", ".join(str(x) for x in written), file=sys.stderr)
    return 0
