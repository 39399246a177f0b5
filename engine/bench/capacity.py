"""`duplexcadence-bench capacity`: how many duplex sessions one device keeps on time, per engine mode.

  duplexcadence-bench capacity [--tail step-audio2] [--backbone synthetic] [--size auto] [--device auto]
                               [--seconds 60] [--max-sessions 16] [--modes stock,optimized,batched,rounds]
                               [--launch threads|one|both] [--start 1] [--window 4] [--json OUT] [--plot PNG]
                               [--no-hand-over] [--switch-interval MS] [--cuda-connections N]
                               [--stock-loop PYTHON --stock-loop-folder DIR]   (MiniCPM-o 4.5)

For each mode an :class:`~engine.host.EngineHost` runs sessions of the same config (shared weights,
each its own input: speech-like bursts and pauses, staggered phases), fed one frame a second in
real time. A ramp adds sessions and measures a short window at each count (stepping by what the
last window's p99 leaves free, then bisecting between the largest clean count and the smallest
that missed); the knee is then confirmed over ``--seconds``. ``max_sessions`` is the largest count
whose confirmation had every session keep the cadence (no second later than its deadline). Then
the first seconds of some sessions are run again, each alone, and compared bit for bit
(``bit_identical_to_solo``).

Modes: *stock-like* (our models with the stock's state policy: stock-sized buffers, torch.cat,
eager), *optimized* (demand-sized state + exact-shape graph replay), *batched* (optimized, plus the
host's batched LISTEN replay when its start-up check passes; else the reason), *rounds* (optimized, plus
MiniCPM-o's LLM rounds: the members' one-token LLM forwards as one group step where the device's check
passed at the group's size, engine/host/llm_rounds.py; phase-aligned like batched). On a CPU this is a
functional dry run at tiny size.

``--stock-loop PYTHON`` (MiniCPM-o 4.5): first, MiniCPM-o-Demo's own duplex loop (eager, as its users run it;
engine/bench/stock_loop.py) runs one session over the first session's input for ``--seconds``, in a subprocess
under ``PYTHON``, and its row gives the stock's count: its worker serves one session per GPU, so 1 when every
second kept the deadline, else 0. Our modes then read the same folder (``--stock-loop-folder``), its voice and
16 kHz input, as the session bench's stock-loop rows do.
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

from engine.cli.validate import OneLineParser
from engine import cuda_queues
from engine.audio import SESSION_RATE, frames_of
from engine.bench import stock_loop
from engine.bench.session import speech_like
from engine.host import EngineHost, WeightsKey
from engine.host.drive import PacedLoad
from engine.bench.ramp import builds_for, confirm, confirm_seconds, ramp
from engine.bench.report import say
from engine.session import DuplexSession, SessionConfig
from engine.session.records import DEADLINE_MS

MODES = {"stock": (False, False), "optimized": (True, True), "batched": (True, True), "rounds": (True, True)}
LABELS = {"stock": "stock-like", "optimized": "optimized", "batched": "batched", "rounds": "rounds"}
CLIP_SECONDS = 30


def session_inputs(n: int, seed: int, rate: int = SESSION_RATE) -> List[List[np.ndarray]]:
    """Per session: 30 s of its own speech-like input at ``rate`` (played cyclically)."""
    return [frames_of(speech_like(CLIP_SECONDS, seed=seed + 1000 + i, rate=rate), rate)[:CLIP_SECONDS]
            for i in range(n)]


# -- one mode -------------------------------------------------------------------------------------------
def solo_check(host: EngineHost, cfg: SessionConfig, load: PacedLoad, sessions: int, seconds: int):
    """Run the first ``seconds`` of some sessions again, each alone; compare bit for bit."""
    chosen = load.sessions if sessions <= 0 else _spread(load.sessions, sessions)
    checked = {}
    from engine import registry
    for d in chosen:
        n = min(seconds, len(d.audio))
        if n == 0:
            continue
        c = cfg
        shared_tail = host.weights.get(WeightsKey.tail(c))
        tail = None if shared_tail is None else registry.get_tail(c.tail).make_tail(
            size=c.size, device=c.device, seed=c.seed, checkpoint=c.checkpoint, shared=shared_tail)
        s = DuplexSession(c, tail=tail, backbone_shared=host.weights.get(WeightsKey.backbone(c)))
        s.start()
        outs = [s.process(d.frames[k % len(d.frames)])[0] for k in range(n)]
        s.close()
        checked[d.index] = bool(np.array_equal(np.concatenate(outs), np.concatenate(d.audio[:n])))
    return checked


def _identical(x: Optional[bool]) -> str:
    return "— (none re-run)" if x is None else str(x)


def _spread(items, k: int):
    if len(items) <= k:
        return list(items)
    idx = sorted({round(i * (len(items) - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]
    return [items[i] for i in idx]


def left(a) -> float:
    """Wall seconds left before ``--time-limit`` (infinite without one)."""
    return a.deadline - time.perf_counter()


def run_mode(mode: str, base: SessionConfig, a, launch: str, inputs, ramp_only: bool = False,
             start: int = 1) -> Dict[str, object]:
    demand, graphs = MODES[mode]
    cfg = base.replace(demand_sized=demand, graph_replay=graphs)
    label = f"{LABELS[mode]} [{launch}]"
    host = EngineHost(device=cfg.device, launch=launch, batched=(mode == "batched"), batch_slots=a.batch_slots,
                      hand_over=a.hand_over, llm_rounds=(mode == "rounds"))
    out: Dict[str, object] = {"launch": launch}
    if mode == "batched":
        ok, why = host.batched_check(cfg)
        out.update(batched_enabled=ok, batched_why=why)
        say(f"{label}: batched replay {'enabled' if ok else 'NOT enabled'}: {why}")
        if not ok:
            host.close()
            return out
    if cfg.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    load = PacedLoad(host, keep_audio=a.solo_seconds, align=a.batch_slots if mode in ("batched", "rounds") else 0)
    t0 = time.perf_counter()
    try:
        ramp_s = min(a.ramp_limit, max(10.0, left(a) - (0 if ramp_only else a.seconds + 40)))
        report = _reporter(a, LABELS[mode], launch)
        knee, points = ramp(load, cfg, inputs, label, a.max_sessions, a.window, ramp_s, start, report)
        seconds = confirm_seconds(a.seconds, left(a), builds_for(load, knee), load.longest_build_s)  # shortened: said
        best, conf = (confirm(load, cfg, inputs, label, knee, seconds, a.confirm_tries, report)
                      if knee and not ramp_only else (knee if ramp_only else 0, None))
        mem = host.memory()
        if host.batcher is not None:
            out["batched_groups"] = host.batcher.report()
        if host.llm_rounds is not None:
            out["llm_rounds"] = host.llm_rounds.report()
            out["llm_rounds_notes"] = sorted({d.runner.hosted.rounds_note for d in load.sessions
                                              if getattr(getattr(d, "runner", None), "hosted", None)})
    finally:
        load.close()
    per = list(mem["sessions"].values())
    out.update({
        "max_sessions": best, "ramp_knee": knee,
        "ramp": [dict(w.to_dict(), window_s=a.window) for _, w in sorted(points.items())],
        "confirmation": None if conf is None else dict(conf.to_dict(), seconds_run=seconds),
        "confirmed": conf is not None and conf.misses == 0,
        "p50_ms": conf.p50_ms if conf else None, "p99_ms": conf.p99_ms if conf else None,
        "memory": {
            "per_session_allocated_bytes": int(np.median([m["allocated_bytes"] for m in per])) if per else 0,
            "per_session_reserved_bytes": int(np.median([m["reserved_bytes"] for m in per])) if per else 0,
            "per_session_state_bytes": int(np.median([m["state_bytes"] for m in per])) if per else 0,
            "shared_weights_bytes": sum(v["bytes"] for v in mem["shared_weights"].values()),
            "max_reserved_bytes": int(torch.cuda.max_memory_reserved()) if cfg.device == "cuda" else 0,
        },
        "errors": load.errors(), "wall_s": time.perf_counter() - t0,
    })
    if ramp_only:
        host.close()
        return out
    checked = solo_check(host, cfg, load, a.solo_sessions, a.solo_seconds)
    out["solo_checked"] = {str(k): v for k, v in checked.items()}
    # None: nothing to compare (no session of the run to re-run alone), not a difference
    out["bit_identical_to_solo"] = all(checked.values()) if checked else None
    say(f"{label}: max_sessions {best}; bit-identical to solo: {_identical(out['bit_identical_to_solo'])} {checked}")
    host.close()
    return out


# -- report ----------------------------------------------------------------------------------------------
def plot(doc: Dict[str, object], path: Path) -> str:
    """Sessions vs p99 (arrival to done) per mode: the ramp windows and the confirmation."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, m in doc["modes"].items():
        ramp_pts = m.get("ramp") or []
        if not ramp_pts:
            continue
        xs = [p["sessions"] for p in ramp_pts]
        ys = [p["p99_ms"] for p in ramp_pts]
        line, = ax.plot(xs, ys, "o-", label=f"{name} (max {m.get('max_sessions')})")
        c = m.get("confirmation")
        if c:
            ax.plot([c["sessions"]], [c["p99_ms"]], "*", ms=14, color=line.get_color())
    ax.axhline(DEADLINE_MS, ls="--", color="grey", lw=1)
    ax.text(ax.get_xlim()[0], DEADLINE_MS, " deadline", va="bottom", color="grey", fontsize=8)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("sessions on one device")
    ax.set_ylabel("p99 arrival-to-done (ms)")
    ax.set_title(f"{doc['tail']} + {doc['backbone']} ({doc['size']}, {doc['gpu']}); * = {doc['seconds']} s run",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return f"plot: {path}"


def table(doc: Dict[str, object], wrap: bool = True) -> str:
    """Per mode: how many sessions kept every second on time, their latency, memory and bit-identity."""
    from engine.stats import table as aligned
    body = []
    for name, m in doc["modes"].items():
        if "max_sessions" not in m:
            why = m.get("error") or m.get("skipped") or f"not enabled: {m.get('batched_why', '')}"
            body.append([name, m.get("launch", ""), "-", "", "", "", "", "", why])
            continue
        mem = m["memory"]
        per = max(mem["per_session_allocated_bytes"], mem["per_session_state_bytes"]) / 2**20
        p50 = f"{m['p50_ms']:.0f}" if m["p50_ms"] is not None else "-"
        p99 = f"{m['p99_ms']:.0f}" if m["p99_ms"] is not None else "-"
        held = (m.get("confirmation") or {}).get("seconds_run")
        body.append([name, m["launch"], m["max_sessions"], "-" if held is None else f"{held:g}", p50, p99,
                     f"{per:.0f}", f"{mem['shared_weights_bytes'] / 2**20:.0f}", _identical(m["bit_identical_to_solo"])])
    stock = doc.get("stock_loop")
    if stock:
        body.insert(0, _stock_row(stock))
    heads = ["mode", "launch", "max sessions", "held s", "p50 ms", "p99 ms", "MiB/session", "shared MiB",
             "bit-identical"]
    return aligned(body, heads, max_widths=[36, 10, None, None, None, None, None, None, 40], wrap=wrap)


def shortened(doc: Dict[str, object]) -> List[str]:
    """One line per mode whose confirmation ran shorter than ``--seconds`` (the time limit left no more): its
    count held for that long only, which is not the confirmation asked for."""
    lines = []
    for name, m in doc["modes"].items():
        held = (m.get("confirmation") or {}).get("seconds_run")
        if held is not None and held < doc["seconds"]:
            lines.append(f"{name}: {m['confirmation']['sessions']} session(s) held {held:g} s, not the "
                         f"{doc['seconds']:g} s asked (--time-limit left no more): not confirmed at "
                         f"{doc['seconds']:g} s")
    return lines


def _stock_row(r: Dict[str, object]) -> List[object]:
    """The stock loop's table row: its one session's count, latency and peak memory (the reference)."""
    if "error" in r:
        return [r["label"], "its worker", "-", "", "", "", "", "", r["error"]]
    ms = lambda x: "-" if x is None else f"{x:.0f}"                          # noqa: E731
    # its process's peak (weights and its one session's state: it shares nothing)
    peak = "-" if r.get("peak_memory_bytes") is None else f"{r['peak_memory_bytes'] / 2**20:.0f} (peak)"
    return [r["label"], "its worker", r["max_sessions"], f"{r['seconds']:g}" if r.get("seconds") else "-",
            ms(r.get("p50_total_ms")), ms(r.get("p99_total_ms")), peak, "-", "reference"]


def _versus_stock(doc: Dict[str, object]) -> Optional[str]:
    """One line on the stock loop's count against the optimized mode's (None without a stock-loop row)."""
    stock, opt = doc.get("stock_loop"), doc["modes"].get("optimized", {})
    if not stock:
        return None
    if stock.get("max_sessions") is None:
        return f"stock loop: not measured ({stock['error']})"
    ours = opt.get("max_sessions")
    have = f"; optimized keeps {ours}" if ours is not None else ""
    return (f"stock loop keeps {stock['max_sessions']} session(s) on time ({stock['misses']} of "
            f"{stock['seconds']} s missed by its one session){have}")


def _markdown(doc: Dict[str, object], path: Path) -> None:
    """The table (one line per row) and the command, next to the JSON."""
    from engine.atomic import atomic_write
    from engine.bench import report
    notes = [f"{doc['tail']} + {doc['backbone']}, {doc['size']}, {doc['gpu']}, {doc['seconds']:g} s asked at the knee "
             f"(held s: how long the confirmation ran)"] + shortened(doc)
    if "optimized_vs_stock_like" in doc:
        notes.append(f"optimized keeps {doc['optimized_vs_stock_like']:.1f}x the sessions of stock-like on time")
    versus = _versus_stock(doc)
    if versus:
        notes += [versus, doc["stock_loop"].get("why", "")]
    md = report.markdown("Sessions one device keeps on time", str(doc["command"]), [("", table(doc, wrap=False))],
                         notes)
    atomic_write(path, lambda f: f.write(md), text=True)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="duplexcadence-bench capacity", description=__doc__.split("\n\n")[0])
    from engine import registry
    p.add_argument("--tail", default=registry.default_tail(), choices=registry.tail_names())
    p.add_argument("--backbone", default=registry.default_backbone(), choices=registry.backbone_names())
    p.add_argument("--backbone-checkpoint", default=None)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--size", default="auto", choices=["auto", "released", "tiny"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--seconds", type=float, default=60.0, help="confirmation run at the knee (s)")
    p.add_argument("--max-sessions", type=int, default=16)
    p.add_argument("--modes", default="stock,optimized,batched",
                   help="comma-separated: stock, optimized, batched, rounds (MiniCPM-o's LLM rounds)")
    p.add_argument("--launch", default="threads", choices=["threads", "one", "both"],
                   help="who launches the seconds; 'both' ramps the optimized mode with each and keeps the better")
    p.add_argument("--window", type=float, default=4.0, help="seconds measured at each ramp step")
    p.add_argument("--start", type=int, default=1, metavar="N",
                   help="the optimized and batched ramps' first count (default 1): where a knee is known, its "
                        "builds go straight there instead of through 1, 2, 4, ...")
    p.add_argument("--ramp-limit", type=float, default=240.0, help="wall seconds a mode's ramp may take")
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="wall seconds for the whole bench (0: none); later modes shorten or are skipped")
    p.add_argument("--confirm-tries", type=int, default=2)
    p.add_argument("--solo-sessions", type=int, default=0,
                   help="sessions of the final run re-run alone for bit-identity (0: every one)")
    p.add_argument("--solo-seconds", type=int, default=8)
    p.add_argument("--batch-slots", type=int, default=8, help="sessions per batched group (phase-aligned)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hand-over", action=argparse.BooleanOptionalAction, default=True,
                   help="a session build hands the capture lock to a running session waiting to capture, between "
                        "its own captures and phases (EngineHost(hand_over=...); on by default, --no-hand-over "
                        "holds it for the whole build)")
    p.add_argument("--switch-interval", type=float, default=None, metavar="MS",
                   help="Python's thread switch interval for the run, in ms (sys.setswitchinterval; default: "
                        "Python's own, 5 ms): how long one session's thread may hold the interpreter while the "
                        "others wait to launch their work")
    cuda_queues.add_option(p, "this process's")
    p.add_argument("--json", default=None, help="write the results here (JSON)")
    p.add_argument("--plot", default=None, help="PNG of sessions vs p99 (default: next to --json)")
    p.add_argument("--stock-loop", default=None, metavar="PYTHON",
                   help="MiniCPM-o 4.5: first run MiniCPM-o-Demo's own duplex loop (one session, eager) under this "
                        "interpreter (.venv-stock/bin/python) for the stock's count (1 or 0)")
    p.add_argument("--stock-loop-folder", default=None, metavar="DIR",
                   help="the MiniCPM-o 4.5 folder in the released layout both sides read")
    return p


def _check_args(a) -> Optional[str]:
    for name in ("seconds", "window"):
        if getattr(a, name) <= 0:
            return f"--{name} must be positive"
    if a.ramp_limit <= 0 or a.time_limit < 0:
        return "--ramp-limit must be positive and --time-limit 0 (none) or positive"
    if a.max_sessions < 1:
        return "--max-sessions must be at least 1"
    if not 1 <= a.start <= a.max_sessions:
        return f"--start must be between 1 and --max-sessions ({a.max_sessions}), not {a.start}"
    if a.solo_seconds < 1 or a.confirm_tries < 1:
        return "--solo-seconds and --confirm-tries must be at least 1"
    if a.switch_interval is not None and not 0.01 <= a.switch_interval <= 1000:
        return f"--switch-interval must be between 0.01 and 1000 ms, not {a.switch_interval:g}"
    return cuda_queues.option_problem(a.cuda_connections)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    before = sys.getswitchinterval()
    try:
        return _run(a)
    finally:
        sys.setswitchinterval(before)             # --switch-interval holds for this run only


def _run(a) -> int:
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
    if a.switch_interval is not None:
        sys.setswitchinterval(a.switch_interval / 1e3)
    a.deadline = time.perf_counter() + a.time_limit if a.time_limit > 0 else float("inf")
    inputs = session_inputs(a.max_sessions, a.seed, base.input_rate)
    doc: Dict[str, object] = {
        "tail": base.tail, "backbone": base.backbone, "size": base.size, "device": base.device,
        "gpu": torch.cuda.get_device_name(0) if base.device == "cuda" else "cpu", "torch": torch.__version__,
        "seconds": a.seconds, "window_s": a.window, "deadline_ms": DEADLINE_MS, "command": " ".join(sys.argv),
        "switch_interval_ms": sys.getswitchinterval() * 1e3,
        "hand_over": bool(a.hand_over),
        "cuda_connections": cuda_queues.in_effect() if base.device == "cuda" else None,
        "modes": {}}
    if a.json:
        def partial(mode_label: str, launch: str, key: str, value: object) -> None:
            entry = doc["modes"].setdefault(mode_label, {"launch": launch, "in_progress": True})
            if entry.get("in_progress"):
                entry[key] = value
                _write(doc, a)
        a.partial = partial
    if folder is not None:                              # first, while the device is still empty
        doc["stock_loop"] = _run_stock(a, base, folder, inputs[0])
        if a.json:
            _write(doc, a)
    launch = a.launch
    if launch == "both":                                # ramps of the optimized mode: one thread vs several
        tried = {lm: _guarded(lambda lm=lm: run_mode("optimized", base, a, lm, inputs, ramp_only=True))
                 for lm in ("one", "threads")}
        knee = {lm: r.get("ramp_knee", 0) for lm, r in tried.items()}
        launch = "one" if knee["one"] > knee["threads"] else "threads"
        doc["launch_comparison"] = {lm: {"ramp_knee": r.get("ramp_knee"), "ramp": r.get("ramp"),
                                         "error": r.get("error")} for lm, r in tried.items()}
        say(f"launch: ramp knees {knee}; '{launch}' kept for every mode")
        a.optimized_start = max(1, knee[launch])
    doc["launch"] = launch
    for m in modes:
        if left(a) < 30:
            doc["modes"][LABELS[m]] = {"launch": launch, "skipped": "the --time-limit was reached before this mode"}
        else:
            start = 1 if m == "stock" else max(a.start, getattr(a, "optimized_start", 1) if m == "optimized" else 1)
            doc["modes"][LABELS[m]] = _guarded(lambda m=m, st=start: run_mode(m, base, a, launch, inputs, start=st),
                                               launch)
        if a.json:                                      # written as it goes: a cut-short run keeps what it had
            _write(doc, a)
    stock, opt = doc["modes"].get("stock-like"), doc["modes"].get("optimized")
    if stock and opt and stock.get("max_sessions"):
        doc["optimized_vs_stock_like"] = opt["max_sessions"] / stock["max_sessions"]
    print(f"capacity: {base.tail} + {base.backbone}, {base.size}, {doc['gpu']}, {a.seconds:g} s asked at the knee "
          f"(held s: how long the confirmation ran)")
    print(table(doc))
    for line in shortened(doc):
        print(line)
    if "optimized_vs_stock_like" in doc:
        print(f"optimized keeps {doc['optimized_vs_stock_like']:.1f}x the sessions of stock-like on time")
    versus = _versus_stock(doc)
    if versus:
        print(versus)
    if a.json:
        _write(doc, a)
        _markdown(doc, Path(a.json).with_suffix(".md"))
        print(plot(doc, Path(a.plot) if a.plot else Path(a.json).with_suffix(".png")))
    elif a.plot:
        print(plot(doc, Path(a.plot)))
    ok = all(m.get("bit_identical_to_solo") is not False for m in doc["modes"].values())
    ok = ok and "error" not in doc.get("stock_loop", {})
    return 0 if ok else 1


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


def _reporter(a, mode_label: str, launch: str) -> Callable[[str, object], None]:
    """Partial results of a mode still running, into the JSON as they come (``a.partial``, set by
    :func:`main` with ``--json``): a run cut short (a call's timeout) keeps its windows and its confirmation so
    far, marked ``in_progress``; the mode's final entry replaces them."""
    partial = getattr(a, "partial", None)
    if partial is None:
        return lambda key, value: None
    return lambda key, value: partial(mode_label, launch, key, value)


def _guarded(fn, launch: str = "") -> Dict[str, object]:
    """A mode's results, or what went wrong (the bench goes on with the next mode)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported in the JSON and on the terminal
        import traceback
        traceback.print_exc()
        say(f"mode failed: {type(e).__name__}: {e}")
        return {"launch": launch, "error": f"{type(e).__name__}: {e}"}


def _write(doc: Dict[str, object], a) -> None:
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    from engine.atomic import atomic_write          # a reader (or a cut) never sees half a file
    atomic_write(out, lambda f: f.write(json.dumps(doc, indent=2, default=str) + "\n"), text=True)


if __name__ == "__main__":
    sys.exit(main())
