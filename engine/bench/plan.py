"""`duplexcadence-bench plan --model NAME`: the planner's view of a model's session."""
from __future__ import annotations

import argparse
import json

from engine.core.planner import format_plan
from engine.models import registry


def main(argv) -> int:
    p = argparse.ArgumentParser(prog="duplexcadence-bench plan", description=__doc__)
    p.add_argument("--model", help="registered model name; omit to plan every registered model")
    p.add_argument("--size", default="released", choices=["released", "tiny"])
    p.add_argument("--steps", type=int, default=None, help="number of steps (default: open-ended live session)")
    p.add_argument("--rows", type=int, default=12, help="timeline rows to print")
    p.add_argument("--json", action="store_true", help="print demand/stock bytes and signatures as JSON")
    a = p.parse_args(argv)
    try:
        models = [a.model] if a.model else registry.names()
        entries = [registry.get(m) for m in models]
    except KeyError as e:
        p.error(str(e.args[0]))
    for i, e in enumerate(entries):
        kw = {"size": a.size}
        if a.steps is not None:
            kw["steps"] = a.steps
        plan = e.plan(**kw)
        if a.json:
            print(json.dumps({"model": e.name, "demand_bytes": plan.demand_bytes(), "stock_bytes": plan.stock_bytes(),
                              "signatures": [s.label for s in plan.signatures]}))
            continue
        if i:
            print("\n" + "=" * 100 + "\n")
        print(f"{e.title} [{e.name}] — {e.architecture}")
        print(format_plan(plan, max_rows=a.rows))
    return 0
