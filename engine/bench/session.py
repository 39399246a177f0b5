"""`duplexcadence-bench session`: the duplex session second by second, stock vs optimized, one run.

  duplexcadence-bench session [--seconds 60] [--tail TAIL] [--backbone BACKBONE]
                              [--size released] [--device cuda] [--modes stock,graphs]
                              [--flip-seconds N] [--account-seconds N] [--account-sites] [--input IN.wav]
                              [--out DIR]

Each mode builds a fresh session (same seed, same input) and runs every second back to back; the
input is paced virtually (frame k arrives at k seconds after the session starts), so a late second
delays the next exactly as it would live. Each run after the first must give the first run's waveform
bit for bit (the first, the reference, is never compared with itself: one run alone reports "n/a"); a
last run flips the toggles every second of the whole run (``--flip-seconds N``: only its first N
seconds, and it says so; 0: no such run) and must give it too. Results: a table on stdout, and
under ``--out`` ``bench.json``, ``bench.md`` (the tables) and ``bench.png`` (ms per second over the session
and the per-stage medians) plus each mode's CSV / JSONL / trace. Mode ``stock`` is our code with the stock's
state policy ("stock-like"); where graph replay cannot run (CPU) the ``graphs`` mode runs eagerly and is
labelled so. A mode may be named twice (``stock,graphs,graphs``): the repeat, "graphs #2", shows whether a
mode repeats its own bits.

Where runs differ, the bench says where: every second keeps digests of each stage (encoder output, LLM
logits per step, text, TTS logits per step, speech codes, the tail's tokens, the audio; see
:mod:`engine.bench.digests`), ``session-<run>-digests.jsonl`` holds them, and ``bench.json``'s
``divergence`` gives, for each run against the first, the first differing second, stage and item and the
first second each stage differs. The digests are taken after each second's timing and kept off the
virtual clock (``--no-digests`` skips them).

Without ``--input`` the input is speech-like and made here (so a machine without espeak-ng can
run it): voiced bursts (a 120 Hz harmonic series, syllable envelope at 4 Hz) of 2-4 s with 3 s
pauses, enough for the voice-activity policy to listen and to answer.

Per-second accounting (``--account-seconds N``, default 6; :mod:`engine.bench.accounting`): after each mode's
run, N of its seconds (half speaking, half listening) are re-run under torch.profiler in a separate run of the
same mode, and the bench prints, per speaking and per listening second, the wall time (from the main,
unprofiled run) next to the CUDA kernel ms, kernel launches, graph launches (profiler and our replay counter)
and copies (on the CPU: the CPU op count, the CUDA columns left empty); ``bench.json`` keeps each mode's
``accounting`` (``per_second`` and the ``speaking`` / ``listening`` means). ``--account-sites`` adds which of
our functions issue each counted second's host operators (:mod:`engine.bench.host_sites`).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from engine.cli.validate import OneLineParser
from engine.atomic import atomic_write
from engine.audio import frames_of, load_mono
from engine.bench import accounting, memory_map, report
from engine.bench.digests import StageTap
from engine.bench.session_report import (Runs, format_slowest, identical_to_reference, outcome,  # noqa: F401
                                         print_report, same_line, slowest_second, stage_table, write_report)
from engine import registry
from engine.core import graphs
from engine.core.toggles import MODES, Toggles
from engine.session import DuplexSession, SessionConfig, export_records, summarize
from engine.session.config import AHEADS
from engine.stats import progress

LABELS = {"stock": "stock-like", "demand": "demand", "graphs": "graphs"}
NO_GRAPHS = "eager (graph replay unavailable)"


def label(mode: str, records) -> str:
    """What a mode's row is called: ``graphs`` only where graph replay ran."""
    if mode == "graphs" and records and not any(r.graph_replay for r in records):
        return NO_GRAPHS
    return LABELS[mode]


def speech_like(seconds: int, seed: int = 0, rate: int = 24000) -> np.ndarray:
    """Voiced bursts and pauses, float32 mono at ``rate``."""
    rng = np.random.default_rng(seed)
    out, n = [], 0
    while n < seconds * rate:
        talk = rng.uniform(2.0, 4.0)
        t = np.arange(int(talk * rate)) / rate
        f0 = 120.0 * (1.0 + 0.05 * np.sin(2 * np.pi * 0.7 * t))
        phase = 2 * np.pi * np.cumsum(f0) / rate
        voiced = sum(np.sin(h * phase) / h for h in range(1, 8))
        env = 0.5 * (1 - np.cos(2 * np.pi * 4.0 * t)) * 0.2
        out += [(voiced * env).astype(np.float32), np.zeros(int(3.0 * rate), np.float32)]
        n = sum(x.size for x in out)
    x = np.concatenate(out)[: seconds * rate]
    return (x + rng.standard_normal(x.size).astype(np.float32) * 1e-3).astype(np.float32)


def _tap_session(s: DuplexSession) -> StageTap:
    """A tap on the backbone's stages (where it offers ``set_tap``) and on the tokens the tail is handed."""
    tap = StageTap()
    set_tap = getattr(s.backbone, "set_tap", None)
    if set_tap is not None:
        set_tap(tap)
    push = s.tail.push

    def push_tapped(tokens):
        tap("tokens", tokens)
        return push(tokens)
    s.tail.push = push_tapped                  # this session's tail only
    return tap


def flip_schedule(seconds: int) -> List[Toggles]:
    """The toggles of each second of the flip run: both off in second 0 (as the run is built), then both
    flipped before every later second, to the run's last."""
    return [Toggles(demand_sized=bool(k % 2), graph_replay=bool(k % 2)) for k in range(seconds)]


class GcClock:
    """The time the cyclic garbage collector ran while installed (``gc.callbacks``), summed in ms."""

    def __init__(self):
        self.ms, self._t0 = 0.0, None

    def __call__(self, phase: str, info) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.ms += (time.perf_counter() - self._t0) * 1000.0
            self._t0 = None

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def run_mode(cfg: SessionConfig, frames: List[np.ndarray], flip: bool = False, desc: str = "",
             quiet: bool = True, digests: bool = True, ahead: str = "off") -> Dict[str, object]:
    """One session over ``frames`` at a virtual one-frame-per-second pace (a progress bar unless ``quiet``);
    with ``flip`` the toggles follow :func:`flip_schedule` over every frame; with ``digests`` each second's
    stage digests (taken off the clock) come back under ``digests``; ``captures`` / ``replays``: each second's
    graph captures and replays (:func:`engine.core.graphs.launches`, no profiler); ``gc_ms``: each second's
    time in the cyclic garbage collector (:class:`GcClock`). ``ahead`` (not ``"off"``):
    after each second, off the virtual clock, the session prepares the next one (:meth:`DuplexSession.ahead`
    with that scope; its time is each record's ``ahead_ms``)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()          # the blocks an earlier run left cached go back first
    t_build = time.perf_counter()
    s = DuplexSession(cfg)
    s.start()
    build_s = time.perf_counter() - t_build
    tap = _tap_session(s) if digests else None
    outs, seconds, captures, replays, gc_ms = [], [], [], [], []
    toggles = flip_schedule(len(frames)) if flip else None
    t0, paused = time.perf_counter(), 0.0
    with progress(len(frames), desc=desc, unit="frame", quiet=quiet) as bar, GcClock() as collector:
        for k, f in enumerate(frames):
            if toggles is not None:
                s.set_toggles(toggles[k])
            arrival = t0 + paused + k                              # frame k arrives k seconds in
            now = time.perf_counter()
            cap0, rep0 = graphs.launches()
            gc0 = collector.ms
            out, rec = s.process(f, arrival=min(arrival, now), backlog=0)
            cap1, rep1 = graphs.launches()
            captures.append(cap1 - cap0)
            replays.append(rep1 - rep0)
            gc_ms.append(collector.ms - gc0)
            if ahead != "off":      # the time before the next frame: the next second's graphs, off the clock
                paused += s.ahead(scope=ahead) / 1000.0
            if tap is not None:                                    # after the second, off the virtual clock
                t_d = time.perf_counter()
                seconds.append(tap.second(k, rec.decision, rec.text, out))
                paused += time.perf_counter() - t_d
            outs.append(out)
            bar.set_postfix_str(f"{rec.total_ms:.0f} ms {rec.decision}", refresh=False)
            bar.update()
    records = list(s.records)
    summary = summarize(records)
    summary["build_s"] = build_s
    summary["max_reserved_bytes"] = max((r.reserved_bytes for r in records), default=0)
    # torch's peak from the end of the build on (DuplexSession.start resets it there): what the build left
    # reserved and every transient inside a second (the stock-loop rows' measure); 0 off CUDA
    cuda = torch.device(cfg.device).type == "cuda"
    summary["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved()) if cuda else 0
    summary["build_peak_reserved_bytes"] = int(getattr(s, "build_peak_reserved", 0))  # the build's own peak
    summary.update(stage_means(records))
    summary["info"] = s.info
    summary["memory_map"] = memory_map.snapshot_map(cfg.device)     # whose reserved memory (CUDA; else None)
    s.close()
    del s
    return {"summary": summary, "records": records, "audio": np.concatenate(outs), "digests": seconds,
            "captures": captures, "replays": replays, "gc_ms": gc_ms}


def stage_means(records) -> Dict[str, float]:
    """Means over all seconds and over speaking seconds (each stage too): the whole duplex second's cost."""
    def mean(vals):
        vals = list(vals)
        return sum(vals) / len(vals) if vals else 0.0
    speak = [r for r in records if r.decision == "speak"]
    listen = [r for r in records if r.decision != "speak"]
    out = {"mean_total_ms": mean(r.total_ms for r in records),
           "mean_speaking_second_ms": mean(r.total_ms for r in speak),
           "mean_listening_second_ms": mean(r.total_ms for r in listen)}
    for stage in ("listen", "think", "speak"):
        out[f"mean_{stage}_ms_speaking"] = mean(getattr(r, f"{stage}_ms") for r in speak)
    out["mean_think_tts_ms_speaking"] = mean(r.think_tts_ms for r in speak)     # THINK's TTS part (where marked)
    # after each second, off its clock: the next second's graphs, and the second with them (must stay < 1 s)
    out["mean_ahead_ms"] = mean(r.ahead_ms for r in records)
    out["max_second_with_ahead_ms"] = max((r.total_ms + r.ahead_ms for r in records), default=0.0)
    return out


def account_mode(cfg: SessionConfig, frames: List[np.ndarray], run: Dict[str, object], n: int,
                 ahead: str = "off", at: Optional[List[int]] = None, sites: bool = False) -> Dict[str, object]:
    """The mode's per-second accounting (:mod:`engine.bench.accounting`): ``n`` seconds picked from the main
    ``run`` (or the seconds ``at``, those the run has), counted under the profiler in a separate run of the same
    config (``sites``: with the host operators' call sites); wall times stay the main run's."""
    cuda = torch.device(cfg.device).type == "cuda"
    speaking = [rec.decision == "speak" for rec in run["records"]]
    picks = ([k for k in at if k < len(speaking)] if at
             else accounting.pick_seconds(speaking, run["captures"], n))
    counted = accounting.account(lambda: DuplexSession(cfg), frames, picks, cuda, ahead, sites)
    return accounting.summary(picks, counted, run["records"], run["replays"], cuda)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="duplexcadence-bench session", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--tail", default=registry.default_tail(), choices=registry.tail_names())
    p.add_argument("--backbone", default=registry.default_backbone(), choices=registry.backbone_names())
    p.add_argument("--backbone-checkpoint", default=None)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--voice", default=None,
                   help="the voice, chosen once: a WAV clip or token2wav prompt features (.npz); default: the "
                        "backbone folder's, else a seeded synthetic prompt")
    p.add_argument("--size", default="auto", choices=["auto", "released", "tiny"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--modes", default="stock,graphs",
                   help="comma-separated: stock (our code with the stock's state policy, shown as stock-like), "
                        "demand, graphs")
    p.add_argument("--flip-seconds", type=int, default=None,
                   help="a last run flips the toggles every second of the whole run (default); N: only its "
                        "first N seconds (said so in the results); 0: no such run")
    p.add_argument("--input", default=None, help="input WAV (default: speech-like input made here)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results/session",
                   help="folder for bench.json, bench.md, bench.png and each mode's records")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--no-digests", action="store_true",
                   help="skip the per-second stage digests (and so the report of where runs differ)")
    p.add_argument("--account-seconds", type=int, default=accounting.DEFAULT_SECONDS,
                   help="per mode, this many seconds (half speaking, half listening) re-run under torch.profiler "
                        "in a separate run: kernel ms, kernel and graph launches per speaking / listening second "
                        f"(default {accounting.DEFAULT_SECONDS}; 0: none). The main run is never profiled")
    p.add_argument("--account-sites", action="store_true",
                   help="the counted seconds also record Python frames: which of our functions (engine/path.py:"
                        "function) issue each second's host operators, and their CPU ms (slower to count)")
    p.add_argument("--account-at", default=None, metavar="K[,K...]",
                   help="count these seconds (0-based) instead of the automatic pick, e.g. the first speaking "
                        "second or the slowest one a run named; counted even with --account-seconds 0")
    p.add_argument("--ahead", choices=list(AHEADS), default="tts",
                   help="minicpm-o-4.5, graphs: after each second, off its clock, capture the next second's graphs "
                        "at their exact positions (tts, the default and the live app's: the TTS steps of a reply "
                        "past its prepared room; listen: LISTEN's forwards and THINK's first; all: every LLM "
                        "forward and the TTS's); each record's ahead_ms says what it took. 'all' took ~2 s a "
                        "second on the H200, past the idle time")
    p.add_argument("--stock-loop", default=None, metavar="PYTHON",
                   help="minicpm-o-4.5: also run MiniCPM-o-Demo's own duplex loop with this interpreter (its venv, "
                        "e.g. .venv-stock/bin/python) over the same folder, input and seed, interleaved with our "
                        "modes, and print the rows side by side (engine/bench/stock_loop.py); this replaces the "
                        "usual tables")
    p.add_argument("--stock-loop-folder", default=None, metavar="DIR",
                   help="the folder in the released layout both sides read (default: --backbone-checkpoint)")
    p.add_argument("--stock-loop-repeats", type=int, default=3,
                   help="interleaved repeats (stock, ours, stock, ours...); each metric is the median (default 3)")
    p.add_argument("--stock-loop-modes", default="eager,compile",
                   help="the stock loop's modes: eager (a worker's first session, as its users start it), warm "
                        "(eager after one earlier session: a serving worker's later session), compile (the demo's "
                        "torch.compile mode)")
    p.add_argument("--stock-loop-attn", default="auto", choices=["auto", "sdpa", "flash_attention_2"],
                   help="the stock loop's attention, as the demo's attn_implementation: auto (its default: "
                        "FlashAttention-2 where flash-attn is usable in its venv, else SDPA), sdpa, flash_attention_2 "
                        "(an error where flash-attn is not usable); the rows say which ran")
    p.add_argument("--stock-loop-compile-timeout", type=int, default=3600,
                   help="seconds the stock loop's torch.compile run may take, its compile and warm-up included "
                        "(past it the row says so; eager runs may take 3600 s)")
    return p


def _stock_loop(a) -> int:
    """``--stock-loop``: check its inputs (one line each), then the interleaved rows (engine/bench/stock_loop.py)."""
    from engine.bench import stock_loop
    stock_modes = [m.strip() for m in a.stock_loop_modes.split(",") if m.strip()]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    try:
        if not stock_modes or any(m not in stock_loop.STOCK_MODES for m in stock_modes):
            raise ValueError(f"--stock-loop-modes {a.stock_loop_modes!r}: choose from "
                             f"{', '.join(stock_loop.STOCK_MODES)}")
        if a.stock_loop_repeats < 1:
            raise ValueError(f"--stock-loop-repeats must be 1 or more, not {a.stock_loop_repeats}")
        folder = stock_loop.check(a.stock_loop, a.stock_loop_folder, a.backbone, a.backbone_checkpoint)
        base = SessionConfig(tail=a.tail, backbone=a.backbone, size=a.size, device=a.device, seed=a.seed,
                             checkpoint=a.checkpoint, **stock_loop.ours_reading(folder)).resolved()
        audio = (load_mono(a.input, rate=stock_loop.RATE, max_seconds=a.seconds) if a.input
                 else speech_like(a.seconds, a.seed, rate=stock_loop.RATE))
    except ValueError as e:
        print(f"duplexcadence-bench session: error: {e}", file=sys.stderr)
        return 2
    a.stock_loop_modes = stock_modes
    rc = stock_loop.compare(a, base, audio, modes, ours=sys.modules[__name__])
    if a.out:                                   # the rows' bench.json gets the run's provenance, as every bench's
        report.stamp(Path(a.out) / "bench.json", report.command_line("duplexcadence-bench session", a.argv))
    return rc


def run_keys(modes: List[str]) -> List[str]:
    """A key per run: the mode's name, ``graphs-2`` for its second run and so on."""
    keys, seen = [], {}
    for m in modes:
        seen[m] = seen.get(m, 0) + 1
        keys.append(m if seen[m] == 1 else f"{m}-{seen[m]}")
    return keys


def _write_digests(path: Path, seconds: List[Dict[str, object]]) -> None:
    """One JSON line per second: ``second``, ``decision``, ``stages`` {stage: [digest]}, ``l1`` {stage: [sum |x|]}."""
    text = "".join(json.dumps(d, sort_keys=True) + "\n" for d in seconds)
    atomic_write(path, lambda f: f.write(text), text=True)


def _problem(a, modes: List[str]) -> Optional[str]:
    """Why the arguments cannot run (None: they can); parses ``--account-at`` in place."""
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        return f"unknown mode(s) {bad}; choose from {', '.join(MODES)}"
    if a.account_seconds < 0:
        return f"error: --account-seconds must be 0 or more, not {a.account_seconds}"
    try:
        a.account_at = accounting.parse_at(a.account_at, a.seconds)
    except ValueError as e:
        return f"error: {e}"
    return None


def _inputs(a) -> Tuple[SessionConfig, List[np.ndarray]]:
    """The resolved config every run starts from, and the input's one-second frames; ValueError in one line."""
    base = SessionConfig(tail=a.tail, backbone=a.backbone, size=a.size, device=a.device, seed=a.seed,
                         checkpoint=a.checkpoint, backbone_checkpoint=a.backbone_checkpoint, voice=a.voice).resolved()
    audio = load_mono(a.input, max_seconds=a.seconds) if a.input else speech_like(a.seconds, a.seed)
    return base, frames_of(audio)[: a.seconds]


def _run_all(a, base: SessionConfig, frames: List[np.ndarray], modes: List[str]) -> Runs:
    """Every run asked, in order, each written under ``--out`` as it ends (a cut-short bench keeps what it had),
    then counted under the profiler where asked (after the main run, never inside it)."""
    runs = Runs(run_keys(modes), modes)
    for key, m in zip(runs.keys, modes):
        t = Toggles.from_mode(m)
        cfg = base.replace(demand_sized=t.demand_sized, graph_replay=t.graph_replay)
        r = run_mode(cfg, frames, desc=LABELS[m], quiet=a.quiet, digests=not a.no_digests, ahead=a.ahead)
        name = label(m, r["records"]) + ("" if key == m else f" #{key.rsplit('-', 1)[1]}")
        runs.results[key], runs.labels[key], runs.rows[name] = r, name, r["summary"]
        print(f"{name}: {r['summary']['seconds']} s, built in {r['summary']['build_s']:.1f} s", file=sys.stderr)
        print(stage_table({name: r["summary"]}), file=sys.stderr, flush=True)
        if a.out:
            export_records(r["records"], Path(a.out), stem=f"session-{key}")
            if not a.no_digests:
                _write_digests(Path(a.out) / f"session-{key}-digests.jsonl", r["digests"])
        if a.account_seconds or a.account_at:
            runs.accounts[name] = r["accounting"] = account_mode(cfg, frames, r, a.account_seconds, a.ahead,
                                                                 a.account_at, a.account_sites)
            print(accounting.format_table({name: r["accounting"]}), file=sys.stderr, flush=True)
    return runs


def _flip_run(a, base: SessionConfig, frames: List[np.ndarray]) -> Tuple[Optional[Dict[str, object]], int]:
    """The last run, the toggles flipped every second over its first N seconds (None when N is 0), and N."""
    n = len(frames) if a.flip_seconds is None else max(0, min(a.flip_seconds, len(frames)))
    if n == 0:
        return None, 0
    fr = run_mode(base.replace(demand_sized=False, graph_replay=False), frames[:n], flip=True,
                  desc="toggles flipped", quiet=a.quiet, digests=not a.no_digests)
    if a.out:
        export_records(fr["records"], Path(a.out), stem="session-flipped")
    return fr, n


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    why = _problem(a, modes)
    if why:
        print(f"duplexcadence-bench session: {why}", file=sys.stderr)
        return 2
    if a.stock_loop is not None:
        return _stock_loop(a)
    try:
        base, frames = _inputs(a)
    except ValueError as e:
        print(f"duplexcadence-bench session: error: {e}", file=sys.stderr)
        return 2
    runs = _run_all(a, base, frames, modes)
    flip_run, n_flip = _flip_run(a, base, frames)
    out = outcome(runs, flip_run, n_flip, len(frames), digests=not a.no_digests)
    cuda = torch.device(base.device).type == "cuda"
    print_report(runs, out, cuda)
    if a.out:
        doc = {"seconds": len(frames), "account_seconds": a.account_seconds, "account_at": a.account_at,
               "account_sites": a.account_sites, "ahead": a.ahead, "reference": runs.keys[0],
               "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
        command = report.command_line("duplexcadence-bench session", a.argv)
        if write_report(Path(a.out), doc, runs, out, command, cuda):
            return 1
    return 0 if all(out.identical.values()) and out.flip is not False else 1


if __name__ == "__main__":
    sys.exit(main())
