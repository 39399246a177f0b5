"""`duplexcadence-bench capacity`: how many duplex sessions one device keeps on time, per engine mode.

  duplexcadence-bench capacity [--tail step-audio2] [--backbone synthetic] [--size auto] [--device auto]
                               [--counts 1,6,12,16,24,32] [--seconds 60] [--bisect 2]
                               [--modes stock,optimized,batched] [--reference own-steps] [--alone 2]
                               [--json OUT] [--plot PNG] [--cuda-connections N]
                               [--stock-loop PYTHON --stock-loop-folder DIR]   (MiniCPM-o 4.5)

For each mode one :class:`~engine.host.EngineHost` (one scheduler: the only thread that launches the device's
work) runs sessions of the same config (shared weights, each its own speech-like input and its own random
moment to join), fed one frame a second in real time. The bench holds each count of ``--counts`` for
``--seconds`` — new sessions built while the others run — and reports every window: mean and p99 second (arrival
to done), late seconds, the GPU's busy share, the scheduler's batches and graph launches per turn, MiB per
session. At the first count with a late second it stops going up and bisects the knee (``--bisect`` more
windows, sessions removed). ``max_sessions`` is the largest count whose window had no late second.

Then every session of the run is compared with its reference over its whole run, every second
(:mod:`engine.bench.reference`): ``--reference own-steps`` runs all of them again without batched steps,
``--alone K`` also runs K of them each by itself in a plain session.

Modes: *stock-like* (our models with the stock's state policy: stock-sized buffers, torch.cat, eager),
*optimized* (demand-sized state + exact-shape graph replay, every session its own steps), *batched* (optimized,
plus the batched steps the backbone declares: MiniCPM-o's one-token LLM forwards of every session at once). On a
CPU this is a functional dry run at tiny size.

``--stock-loop PYTHON`` (MiniCPM-o 4.5): first, MiniCPM-o-Demo's own duplex loop (eager, as its users run it;
engine/bench/stock_loop.py) runs one session over the first session's input for ``--seconds``, in a subprocess
under ``PYTHON``; its worker serves one session per GPU, so its count is 1 when every second kept the deadline,
else 0. Our modes then read the same folder, its voice and 16 kHz input.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from engine import cuda_queues
from engine.audio import SESSION_RATE, frames_of
from engine.bench import reference, stock_loop
from engine.bench.capacity_report import plot, table, write_markdown
from engine.bench.ramp import step_through
from engine.bench.report import say
from engine.bench.session import speech_like
from engine.cli.validate import OneLineParser
from engine.host import EngineHost
from engine.host.drive import PacedLoad
from engine.session import SessionConfig
from engine.session.records import DEADLINE_MS

MODES = {"stock": (False, False, False), "optimized": (True, True, False), "batched": (True, True, True)}
LABELS = {"stock": "stock-like", "optimized": "optimized", "batched": "batched"}
REFERENCES = ("own-steps", "none")
CLIP_SECONDS = 30


def session_inputs(n: int, seed: int, rate: int = SESSION_RATE) -> List[List[np.ndarray]]:
    """Per session: 30 s of its own speech-like input at ``rate`` (played cyclically), from its own offset."""
    out = []
    for i in range(n):
        frames = frames_of(speech_like(CLIP_SECONDS, seed=seed + 1000 + i, rate=rate), rate)[:CLIP_SECONDS]
        k = (7 * i) % len(frames)
        out.append(frames[k:] + frames[:k])
    return out


def run_mode(mode: str, base: SessionConfig, a, inputs) -> Dict[str, object]:
    demand, graphs_on, batched = MODES[mode]
    cfg = base.replace(demand_sized=demand, graph_replay=graphs_on)
    label = LABELS[mode]
    host = EngineHost(device=cfg.device, batched=batched)
    load = PacedLoad(host, seed=a.seed)
    t0 = time.perf_counter()
    try:
        knee, steps = step_through(load, cfg, inputs, label, a.counts, a.seconds, a.bisect, _reporter(a, label))
        driven = sorted(load.sessions + load.removed(), key=lambda d: d.index)
        errors = load.errors()
    finally:
        load.close()
    out: Dict[str, object] = {
        "max_sessions": knee, "steps": [steps[k] for k in sorted(steps)], "errors": errors,
        "scheduler": host.scheduler_report(), "batched_steps": _runner_reports(host),
        "wall_s": round(time.perf_counter() - t0, 1)}
    out.update(_references(host, cfg, a, driven, label))
    host.close()
    return out


def _runner_reports(host: EngineHost) -> Dict[str, object]:
    return {kind: r.report() for (kind, _), r in host.scheduler._runners.items() if hasattr(r, "report")}


def _references(host: EngineHost, cfg: SessionConfig, a, driven, label: str) -> Dict[str, object]:
    """Every session against its reference over its whole run (see engine.bench.reference)."""
    out: Dict[str, object] = {}
    if a.reference == "own-steps":
        say(f"{label}: every session's whole run again, own steps only ({len(driven)} sessions) ...")
        out["own_steps"] = {str(k): v for k, v in reference.own_steps(host, cfg, driven).items()}
    if a.alone > 0:
        say(f"{label}: {a.alone} session(s) again, each alone ...")
        out["alone"] = {str(k): v for k, v in host.scheduler.run(
            lambda: reference.alone(host, cfg, driven, a.alone)).items()}
    checked = [v["identical"] for key in ("own_steps", "alone") for v in out.get(key, {}).values()]
    out["bit_identical_to_solo"] = all(checked) if checked else None
    say(f"{label}: every session identical to its reference over its whole run: {out['bit_identical_to_solo']}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="duplexcadence-bench capacity", description=__doc__.split("\n\n")[0])
    from engine import registry
    p.add_argument("--tail", default=registry.default_tail(), choices=registry.tail_names())
    p.add_argument("--backbone", default=registry.default_backbone(), choices=registry.backbone_names())
    p.add_argument("--backbone-checkpoint", default=None)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--size", default="auto", choices=["auto", "released", "tiny"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--counts", default="1,6,12,16,24,32", help="session counts held in turn (comma-separated)")
    p.add_argument("--seconds", type=float, default=60.0, help="how long each count is held (s)")
    p.add_argument("--bisect", type=int, default=2, help="windows spent bisecting the knee after a late count")
    p.add_argument("--modes", default="batched", help="comma-separated: stock, optimized, batched")
    p.add_argument("--reference", default="own-steps", choices=REFERENCES,
                   help="every session's whole run again without batched steps, every second compared")
    p.add_argument("--alone", type=int, default=1, help="sessions also run again each by itself (0: none)")
    p.add_argument("--seed", type=int, default=0)
    cuda_queues.add_option(p, "this process's")
    p.add_argument("--json", default=None, help="write the results here (JSON)")
    p.add_argument("--plot", default=None, help="PNG of each session's seconds against the deadline per count "
                                                "(default: next to --json)")
    p.add_argument("--stock-loop", default=None, metavar="PYTHON",
                   help="MiniCPM-o 4.5: first run MiniCPM-o-Demo's own duplex loop (one session, eager) under this "
                        "interpreter (.venv-stock/bin/python) for the stock's count (1 or 0)")
    p.add_argument("--stock-loop-folder", default=None, metavar="DIR",
                   help="the MiniCPM-o 4.5 folder in the released layout both sides read")
    return p


def _check_args(a) -> Optional[str]:
    if not (a.seconds > 0 and np.isfinite(a.seconds)):
        return f"--seconds must be a positive number, not {a.seconds}"
    try:
        a.counts = sorted({int(c) for c in str(a.counts).split(",") if c.strip()})
    except ValueError:
        return f"--counts takes whole numbers separated by commas, not {a.counts!r}"
    if not a.counts or a.counts[0] < 1:
        return "--counts must name at least one count, each at least 1"
    if a.bisect < 0 or a.alone < 0:
        return "--bisect and --alone must be 0 or more"
    return cuda_queues.option_problem(a.cuda_connections)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    why = _check_args(a) or (f"unknown mode(s) {bad}; choose from {', '.join(MODES)}" if bad or not modes else None)
    folder = None
    try:
        if not why:                                     # before anything starts CUDA
            cuda_queues.request(a.cuda_connections)
        fields = dict(tail=a.tail, backbone=a.backbone, size=a.size, device=a.device, seed=a.seed,
                      checkpoint=a.checkpoint, backbone_checkpoint=a.backbone_checkpoint)
        if not why and a.stock_loop is not None:       # ours read the stock's folder, voice and 16 kHz input
            folder = stock_loop.check(a.stock_loop, a.stock_loop_folder, a.backbone, a.backbone_checkpoint)
            fields.update(stock_loop.ours_reading(folder))
        base = SessionConfig(**fields).resolved()
    except (ValueError, cuda_queues.TooLate) as e:
        why = why or str(e)
    if why:
        print(f"duplexcadence-bench capacity: error: {why}", file=sys.stderr)
        return 2
    if base.device == "cpu":
        torch.set_num_threads(1)
        base = base.replace(cpu_threads=1)
    inputs = session_inputs(max(a.counts), a.seed, base.input_rate)
    doc = _doc(a, base)
    if a.json:
        a.partial = _partial(doc, a)
    if folder is not None:                              # first, while the device is still empty
        doc["stock_loop"] = _run_stock(a, base, folder, inputs[0])
        _write(doc, a)
    for m in modes:
        doc["modes"][LABELS[m]] = _guarded(lambda m=m: run_mode(m, base, a, inputs))
        _write(doc, a)
    return _finish(doc, a)


def _doc(a, base: SessionConfig) -> Dict[str, object]:
    from engine.bench import provenance
    return {"tail": base.tail, "backbone": base.backbone, "size": base.size, "device": base.device,
            "gpu": torch.cuda.get_device_name(0) if base.device == "cuda" else "cpu", "torch": torch.__version__,
            "counts": a.counts, "seconds": a.seconds, "deadline_ms": DEADLINE_MS, "command": " ".join(sys.argv),
            "reference": a.reference, "alone": a.alone, "provenance": provenance.record(" ".join(sys.argv)),
            "cuda_connections": cuda_queues.in_effect() if base.device == "cuda" else None, "modes": {}}


def _finish(doc: Dict[str, object], a) -> int:
    print(f"capacity: {doc['tail']} + {doc['backbone']}, {doc['size']}, {doc['gpu']}, counts {doc['counts']} "
          f"held {doc['seconds']:g} s each")
    print(table(doc))
    if a.json:
        _write(doc, a)
        write_markdown(doc, Path(a.json).with_suffix(".md"))
        print(plot(doc, Path(a.plot) if a.plot else Path(a.json).with_suffix(".png")))
    elif a.plot:
        print(plot(doc, Path(a.plot)))
    ok = all(m.get("bit_identical_to_solo") is not False and "error" not in m for m in doc["modes"].values())
    return 0 if ok and "error" not in doc.get("stock_loop", {}) else 1


def _run_stock(a, base: SessionConfig, folder: Path, frames: List[np.ndarray]) -> Dict[str, object]:
    """The stock loop's one session over ``--seconds`` of the first session's input (played cyclically, as
    our sessions play theirs)."""
    n = int(np.ceil(a.seconds))
    audio = np.concatenate([frames[k % len(frames)] for k in range(n)])
    work = (Path(a.json).parent if a.json else Path(tempfile.mkdtemp(prefix="capacity-"))) / "stock-loop"
    threads = torch.get_num_threads() if base.device == "cuda" else 1
    say(f"stock loop: one session of MiniCPM-o-Demo's duplex loop (eager) over {n} s ...")
    r = stock_loop.capacity_row(Path(a.stock_loop), folder, audio, work, a.seed, base.device, threads)
    say("stock loop: " + (r["error"] if "error" in r else
                          f"{r['misses']} of {r['seconds']} s missed, p99 {r['p99_total_ms']:.0f} ms -> "
                          f"{r['max_sessions']} session(s)"))
    return r


def _partial(doc: Dict[str, object], a) -> Callable[[str, str, object], None]:
    def partial(mode_label: str, key: str, value: object) -> None:
        entry = doc["modes"].setdefault(mode_label, {"in_progress": True})
        if entry.get("in_progress"):
            entry[key] = value
            _write(doc, a)
    return partial


def _reporter(a, mode_label: str) -> Callable[[str, object], None]:
    """Partial results of a mode still running, into the JSON as they come (a run cut short keeps its windows,
    marked ``in_progress``; the mode's final entry replaces them)."""
    partial = getattr(a, "partial", None)
    if partial is None:
        return lambda key, value: None
    return lambda key, value: partial(mode_label, key, value)


def _guarded(fn) -> Dict[str, object]:
    """A mode's results, or what went wrong (the bench goes on with the next mode)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported in the JSON and on the terminal
        import traceback
        traceback.print_exc()
        say(f"mode failed: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {e}"}


def _write(doc: Dict[str, object], a) -> None:
    if not a.json:
        return
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    from engine.atomic import atomic_write          # a reader (or a cut) never sees half a file
    atomic_write(out, lambda f: f.write(json.dumps(doc, indent=2, default=str) + "\n"), text=True)


if __name__ == "__main__":
    sys.exit(main())
