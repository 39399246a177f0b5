"""`duplexcadence run`: a headless duplex session over a WAV file, with every second on the record.

  duplexcadence run --input IN.wav --output OUT.wav --log DIR [--model TAIL]
                    [--backbone synthetic|moshi] [--checkpoint PATH] [--backbone-checkpoint DIR]
                    [--size auto|released|tiny] [--device auto|cpu|cuda] [--mode stock|demand|graphs]
                    [--realtime] [--seconds N]

IN.wav may have any sample rate and channel count (mixed down, resampled to 24 kHz). OUT.wav is
24 kHz mono with one second out per second in (second k's answer is second k of OUT.wav: it
plays while second k+1 comes in). DIR receives session.csv, session.jsonl, session.trace.json
(open it in Perfetto) and summary.json. Default pace: as fast as possible; ``--realtime`` feeds
one second per second through the live runner, so a slow second makes the next frames queue.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Tuple

import numpy as np

from engine.audio import AudioError, frames_of, load_mono, write_wav
from engine.models import registry
from engine.session import (DuplexSession, ExportError, LiveError, LiveRunner, SessionConfig, export_records,
                            format_summary, summarize)
from engine.session.export import _atomic_write

MODES = {"stock": (False, False), "demand": (True, False), "graphs": (True, True)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplexcadence run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="input WAV (any rate, any channels)")
    p.add_argument("--output", required=True, help="output WAV (24 kHz mono)")
    p.add_argument("--log", required=True, help="folder for session.csv / .jsonl / .trace.json / summary.json")
    p.add_argument("--model", default="step-audio2", choices=registry.tail_names(), help="decoder tail (SPEAK)")
    p.add_argument("--backbone", default="synthetic", choices=["synthetic", "moshi"], help="LISTEN + THINK")
    p.add_argument("--checkpoint", help="decoder tail weights (" + registry.checkpoint_hints() + "); with "
                                        "--backbone moshi a folder here is taken as the Moshi weights folder")
    p.add_argument("--backbone-checkpoint", help="Moshi weights folder (model.safetensors, Mimi, tokenizer)")
    p.add_argument("--size", default="auto", choices=["auto", "released", "tiny"],
                   help="auto: released on a GPU, tiny on a CPU")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--mode", default="graphs", choices=list(MODES),
                   help="engine toggles: stock (stock-sized state, eager), demand, graphs (demand + graph replay)")
    p.add_argument("--realtime", action="store_true", help="pace the input at one second per second")
    p.add_argument("--seconds", type=int, default=None, help="use only the first N seconds of the input")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def make_config(a: argparse.Namespace) -> SessionConfig:
    demand, graphs = MODES[a.mode]
    ckpt, bb_ckpt = a.checkpoint, a.backbone_checkpoint
    if a.backbone == "moshi" and bb_ckpt is None and ckpt and Path(ckpt).is_dir():
        ckpt, bb_ckpt = None, ckpt
    cfg = SessionConfig(tail=a.model, backbone=a.backbone, size=a.size, device=a.device, checkpoint=ckpt,
                        backbone_checkpoint=bb_ckpt, demand_sized=demand, graph_replay=graphs, seed=a.seed)
    return cfg.resolved()


class Progress:
    """A one-line progress bar on stderr (a line every 10 s when stderr is not a terminal)."""

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.quiet = total, quiet
        self.tty = sys.stderr.isatty()

    def update(self, done: int, rec) -> None:
        if self.quiet or not (self.tty or done % 10 == 0 or done == self.total):
            return
        width = 30
        fill = int(width * done / max(1, self.total))
        bar = "#" * fill + "." * (width - fill)
        line = (f"[{bar}] {done}/{self.total} s  last {rec.total_ms:6.1f} ms  {rec.decision:<6}"
                f"{'  MISSED by %.0f ms' % rec.late_ms if rec.missed else ''}")
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty and not self.quiet:
            print(file=sys.stderr)


def announce(info: dict) -> None:
    """Say what runs (and, loudly, when the weights are synthetic)."""
    print(f"session: {info['tail_title']} <- {info['backbone_title']} on {info['device']} ({info['size']})",
          file=sys.stderr)
    if info.get("synthetic"):
        print(f"NOTE: {info['note']}", file=sys.stderr)


def run_fast(cfg: SessionConfig, frames: List[np.ndarray], progress: Progress) -> Tuple[list, list]:
    """Every second back to back, as fast as the engine goes."""
    s = DuplexSession(cfg)
    s.start()
    announce(s.info)
    outs = []
    try:
        for i, f in enumerate(frames):
            out, rec = s.process(f)
            outs.append(out)
            progress.update(i + 1, rec)
    finally:
        s.close()
    return outs, s.records


def run_realtime(cfg: SessionConfig, frames: List[np.ndarray], progress: Progress) -> Tuple[list, list]:
    """One frame per second into the live runner; late seconds make frames queue (none dropped)."""
    runner = LiveRunner(cfg)
    runner.start()
    runner.ready.wait()
    if runner.session is not None:
        announce(runner.session.info)
    outs, records = [], []
    t0 = time.perf_counter()
    submitted = 0
    while len(records) < len(frames):
        now = time.perf_counter() - t0
        while submitted < len(frames) and now >= submitted:   # frame k arrives at t0 + k seconds
            runner.submit(frames[submitted])
            submitted += 1
        try:
            item = runner.results.get(timeout=0.02)
        except Exception:  # queue.Empty
            if not runner.running and runner.results.empty():
                raise RuntimeError("the live runner stopped before the end of the input")
            continue
        if isinstance(item, LiveError):
            runner.stop()
            raise RuntimeError(item.message)
        outs.append(item.audio)
        records.append(item.record)
        progress.update(len(records), item.record)
    runner.stop(timeout=30.0)
    if runner.session is not None:
        runner.session.close()
    return outs, records


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        cfg = make_config(a)
        audio = load_mono(a.input)
    except (ValueError, AudioError) as e:
        print(f"duplexcadence run: error: {e}", file=sys.stderr)
        return 2
    frames = frames_of(audio)
    if a.seconds is not None:
        frames = frames[: max(1, a.seconds)]
    progress = Progress(len(frames), a.quiet)
    try:
        outs, records = (run_realtime if a.realtime else run_fast)(cfg, frames, progress)
    except (ValueError, RuntimeError, ImportError, FileNotFoundError) as e:
        progress.close()
        print(f"duplexcadence run: error: {e}", file=sys.stderr)
        return 1
    progress.close()
    summary = summarize(records)
    summary.update({"config": {k: v for k, v in vars(cfg).items()}, "input": str(a.input),
                    "pace": "realtime" if a.realtime else "fast"})
    try:
        write_wav(a.output, np.concatenate(outs), 24000)
        paths = export_records(records, a.log, metadata={"config": summary["config"]})
        _atomic_write(Path(a.log) / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    except (ExportError, AudioError) as e:
        print(f"duplexcadence run: error: {e}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    print(f"wrote {a.output} ({len(outs)} s, 24 kHz mono) and {', '.join(str(v) for v in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
