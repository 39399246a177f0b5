"""`duplexcadence-bench twin`: how many sessions a device would keep on time, predicted on the CPU.

  duplexcadence-bench twin --table COSTS.json [--counts 1,6,12,16,24,32] [--seconds 60] [--sessions 8]
                           [--shape-seconds 30] [--json OUT]

First the real scheduler runs ``--sessions`` MiniCPM-o 4.5 sessions at tiny dims on this CPU, each over its own
speech-like input (the capacity bench's), and every second's shape is read off its record: whether it spoke, its
one-token LLM steps, TTS steps and token2wav calls (the voice-activity turn policy decides at any dims as at the
released ones). Then the twin (:mod:`engine.host.twin`) replays those seconds for each session count on a clock
simulated from ``--table``, a cost table measured on the device (host and device ms per step kind, the group LLM
step at each row count), and prints per count the late seconds and the p99, and the most sessions with none late.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

from engine.bench.capacity import session_inputs
from engine.bench import provenance
from engine.bench.report import say
from engine.host import EngineHost
from engine.host.twin import CostTable, Shape, capacity, predict, shapes_of
from engine.session import LiveError, SessionConfig


def cpu_shapes(sessions: int, seconds: int, seed: int = 0) -> List[List[Shape]]:
    """Each session's seconds as the scheduler ran them on this CPU (tiny dims, unpaced)."""
    torch.set_num_threads(1)
    cfg = SessionConfig(tail="step-audio2", backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=seed,
                        cpu_threads=1)
    inputs = session_inputs(sessions, seed, cfg.input_rate)
    host = EngineHost(device="cpu")
    try:
        runners = [host.open(cfg, force=True) for _ in range(sessions)]
        for r in runners:
            r.start()
        for r, frames in zip(runners, inputs):
            r.ready.wait()
            for k in range(seconds):
                r.submit(frames[k % len(frames)])
        out = []
        for r in runners:
            recs = [r.results.get() for _ in range(seconds)]
            bad = next((x for x in recs if isinstance(x, LiveError)), None)
            if bad is not None:
                raise RuntimeError(bad.message)
            out.append(shapes_of([x.record for x in recs]))
        return out
    finally:
        host.close()


def summary(shapes: List[List[Shape]]) -> Dict[str, float]:
    flat = [s for row in shapes for s in row]
    speaking = [s for s in flat if s.speak]
    return {"seconds": len(flat), "speaking_share": round(len(speaking) / max(1, len(flat)), 3),
            "llm_steps_per_speaking_second": round(float(np.mean([s.llm_steps for s in speaking])), 2) if speaking else 0,
            "llm_steps_per_listening_second": round(float(np.mean([s.llm_steps for s in flat if not s.speak])), 2)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplexcadence-bench twin", description=__doc__.split("\n\n")[0])
    p.add_argument("--table", required=True, help="the device's cost table (JSON, see engine/host/twin.py)")
    p.add_argument("--counts", default="1,6,12,16,24,32")
    p.add_argument("--seconds", type=int, default=60, help="seconds simulated per count")
    p.add_argument("--sessions", type=int, default=8, help="distinct sessions run on the CPU for their shapes")
    p.add_argument("--shape-seconds", type=int, default=30, help="seconds each of them runs (cycled after)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        counts = sorted({int(c) for c in a.counts.split(",") if c.strip()})
        if not counts or counts[0] < 1 or a.seconds < 1 or a.sessions < 1 or a.shape_seconds < 1:
            raise ValueError("--counts, --seconds, --sessions and --shape-seconds must be at least 1")
        table = CostTable.load(a.table)
    except (ValueError, KeyError, OSError, json.JSONDecodeError) as e:
        print(f"duplexcadence-bench twin: error: {e}", file=sys.stderr)
        return 2
    say(f"twin: {a.sessions} session(s) x {a.shape_seconds} s on this CPU for the seconds' shapes ...")
    shapes = cpu_shapes(a.sessions, a.shape_seconds, a.seed)
    pred = predict(table, shapes, counts, a.seconds)
    doc = {"table": a.table, "device": table.device, "table_source": table.source, "shapes": summary(shapes),
           "predicted": {str(k): v for k, v in pred.items()},
           "predicted_max_sessions": capacity(table, shapes, max(counts), a.seconds),
           "command": " ".join(sys.argv), "provenance": provenance.record(" ".join(sys.argv))}
    for n, v in pred.items():
        print(f"{n:>3} sessions: {v['late']} of {v['seconds']} seconds late, mean {v['mean_ms']:.0f} ms, "
              f"p99 {v['p99_ms']:.0f} ms")
    print(f"predicted on {table.device}: {doc['predicted_max_sessions']} sessions with no late second "
          f"({doc['shapes']})")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
