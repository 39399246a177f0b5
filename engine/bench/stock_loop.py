"""`duplexcadence-bench session --backbone minicpm-o-4.5 --stock-loop PYTHON`: MiniCPM-o 4.5's real duplex loop
next to ours, interleaved, as its users run it.

The stock loop is MiniCPM-o-Demo's own (``../shared/oracles/MiniCPM-o-Demo-28b60cf``), driven by the test
harness ``tests/stock_loop/run_stock.py`` in a subprocess under the interpreter ``PYTHON`` (its own venv,
``.venv-stock``: transformers 4.51). It is a benchmark oracle: nothing of it is imported here or by the product.

Both sides read the SAME folder in the released layout (``--stock-loop-folder DIR``, or ``--backbone-checkpoint
DIR``: ours is built from it too, so both run the same weights), the same 16 kHz samples (the bench's speech-like
input made at 16 kHz, or ``--input`` read at 16 kHz; ours takes them as they are, ``input_rate`` 16000), the
same seed, the folder's ``voice.npz`` as token2wav's prompt and its ``assets/HT_ref_audio.wav`` as the LLM's
reference clip, the default system prompt; on the CPU both sides run one torch thread (the bits the oracle tests
compare: each of our rows says how many of its decisions are the stock eager run's).

Runs are interleaved: for each repeat, the stock loop eager, the stock loop under the demo's ``torch.compile``
mode (``apply_torch_compile(mode="default", dynamic=True)`` and a warm-up session, as the demo's loader does
when ``compile`` is set), then each of our modes; every metric is the median over the repeats. Per row: mean
speaking second, mean listening second, p99 of the second, misses (the same virtual pacing as ours: second k
arrives k seconds in, seconds run back to back, a second is missed when its wait plus its time passes 1,000 ms),
peak memory (CUDA: ``torch.cuda.max_memory_reserved`` of the run; CPU: the process's peak RSS, VmHWM, reset
before each of our runs), and for each of our rows the speed ratio against the stock eager row (stock ms / ours:
above 1 is faster than the stock). The compile row says whether it kept the stock eager run's bits (each
second's decision, text and waveform, hashed); where compile fails or does not finish within
``--stock-loop-compile-timeout`` seconds, the row says so in one line and has no numbers. ``warm`` runs the eager
stock after one earlier session in the same process (a serving worker's later session).

Each stock row says exactly what it ran with (printed under the rows, ``ran_with`` in bench.json): the attention
kernel (``--stock-loop-attn``, default auto as the demo's own default: FlashAttention-2 where flash-attn is usable
in the stock's venv, else SDPA), torch, transformers, flash-attn where installed, and the token2wav package and
its version.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from engine.atomic import atomic_write
from engine.bench import accounting, memory_map
from engine.session.records import DEADLINE_MS
from engine.stats import MIB, percentile, table

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "stock_loop" / "run_stock.py"
ORACLE = ROOT.parent / "shared" / "oracles" / "MiniCPM-o-Demo-28b60cf"
RATE = 16000
STOCK_MODES = ("eager", "warm", "compile")
STOCK_LABELS = {"eager": "stock loop (MiniCPM-o-Demo, eager)",
                "warm": "stock loop (MiniCPM-o-Demo, eager, warmed)",
                "compile": "stock loop (MiniCPM-o-Demo, torch.compile)"}
#: what the stock harness reads from the folder (a released folder's ONNX models are not used: voice.npz is
#: token2wav's prompt on both sides)
RELEASED_LAYOUT = ("config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                   "assets/token2wav/flow.yaml", "assets/token2wav/flow.pt", "assets/token2wav/hift.pt",
                   "assets/HT_ref_audio.wav", "voice.npz")
METRICS = ("mean_speaking_second_ms", "mean_listening_second_ms", "p99_total_ms", "misses", "peak_memory_bytes")
DEFAULT_TIMEOUT_S = 3600


class StockLoopError(ValueError):
    """Bad input for the stock-loop rows: one line saying what is wrong."""


def check(python: Optional[str], folder: Optional[str], backbone: str, backbone_checkpoint: Optional[str],
          oracle: Path = ORACLE, runner: Path = RUNNER) -> Path:
    """The folder both sides read, after checking everything the stock loop needs; StockLoopError otherwise."""
    if backbone != "minicpm-o-4.5":
        raise StockLoopError(f"--stock-loop is MiniCPM-o 4.5's own duplex loop: use --backbone minicpm-o-4.5, "
                             f"not {backbone}")
    if not python or not Path(python).is_file() or not os.access(python, os.X_OK):
        raise StockLoopError(f"the stock-loop interpreter {python!r} is not an executable file (the stock venv "
                             ".venv-stock is built from tests/stock-loop-requirements.txt; make test builds it)")
    if not oracle.is_dir():
        raise StockLoopError(f"the stock oracle {oracle} is absent (../shared/oracles beside the clone holds "
                             "MiniCPM-o-Demo at 28b60cf)")
    if not runner.is_file():
        raise StockLoopError(f"the stock-loop harness {runner} is absent (it ships with the source tree's tests/)")
    if folder and backbone_checkpoint and Path(folder).resolve() != Path(backbone_checkpoint).resolve():
        raise StockLoopError(f"--stock-loop-folder {folder} and --backbone-checkpoint {backbone_checkpoint} differ: "
                             "both sides must read the same weights (give one of them)")
    chosen = folder or backbone_checkpoint
    if not chosen:
        raise StockLoopError("--stock-loop needs --stock-loop-folder DIR (or --backbone-checkpoint DIR): the stock "
                             "loop reads only a MiniCPM-o 4.5 folder in the released layout")
    path = Path(chosen).expanduser()
    missing = [f for f in RELEASED_LAYOUT if not (path / f).is_file()]
    if missing:
        raise StockLoopError(f"{path} is not a MiniCPM-o 4.5 folder in the released layout the stock loop reads: "
                             f"no {', '.join(missing)} (tests/minicpmo45_stock_folder.py writes one)")
    return path.resolve()


def ours_reading(folder: Path) -> Dict[str, object]:
    """What our side of a stock-loop comparison takes from the stock's folder (SessionConfig fields): its
    weights, its ``voice.npz`` as token2wav's prompt, and 16 kHz input (the stock's own)."""
    return {"backbone_checkpoint": str(folder), "voice": str(folder / "voice.npz"), "input_rate": RATE}


def write_input(work: Path, audio: np.ndarray) -> Path:
    """The 16 kHz samples the stock loop reads, as a float WAV under ``work``."""
    import soundfile as sf
    work.mkdir(parents=True, exist_ok=True)
    wav = work / "stock-loop-input-16k.wav"
    sf.write(str(wav), np.asarray(audio, np.float32), RATE, subtype="FLOAT")
    return wav


def paced(ms: List[float]) -> List[bool]:
    """Missed seconds of a run paced as the session bench paces ours: seconds run back to back, second k
    arrives k seconds in, its wait is how far its start is past that, and it is missed when wait + time
    passes the deadline (:func:`engine.session.records.lateness`)."""
    out, start = [], 0.0
    for k, t in enumerate(ms):
        out.append(max(0.0, start - k * 1000.0) + t > DEADLINE_MS)
        start += t
    return out


def row_of(ms: List[float], decisions: List[str], peak: Optional[int]) -> Dict[str, object]:
    """A run's row from its per-second wall ms and decisions."""
    speak = [t for t, d in zip(ms, decisions) if d == "speak"]
    listen = [t for t, d in zip(ms, decisions) if d != "speak"]
    return {"mean_speaking_second_ms": float(np.mean(speak)) if speak else None,
            "mean_listening_second_ms": float(np.mean(listen)) if listen else None,
            "p50_total_ms": percentile(ms, 50), "p99_total_ms": percentile(ms, 99), "misses": sum(paced(ms)),
            "peak_memory_bytes": peak,
            "seconds": len(ms), "speak_seconds": len(speak), "decisions": list(decisions)}


def run_stock(python: Path, folder: Path, wav: Path, out: Path, seed: int, seconds: int, device: str,
              threads: int, compile: bool, timeout_s: int = DEFAULT_TIMEOUT_S, warm: bool = False,
              attn: str = "auto") -> Dict[str, object]:
    """One stock-loop run in a subprocess: its row plus ``digests`` and ``ran_with`` (its attention, torch,
    transformers, flash-attn and token2wav package), or ``{"error": one line}``. ``warm``: the eager stock after
    one earlier session (a serving worker's later session); ``attn``: the demo's attention choice (auto, its
    default: FlashAttention-2 where usable, else SDPA)."""
    cmd = [str(python), str(RUNNER), "--oracle", str(ORACLE), "--folder", str(folder), "--wav", str(wav),
           "--out", str(out), "--seed", str(seed), "--seconds", str(seconds), "--device", device,
           "--threads", str(threads), "--attn", attn, "--no-record"] + (["--compile"] if compile else []) + (
               ["--warm"] if warm else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"not measured: did not finish in {timeout_s} s"}
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        return {"error": f"not measured: the stock loop exited {r.returncode}: "
                         f"{lines[-1].strip() if lines else 'no message'}"[:300]}
    doc = json.loads((out / "timing.json").read_text())
    secs = doc["seconds"]
    row = row_of([s["ms"] for s in secs], [s["decision"] for s in secs], doc.get("peak_memory_bytes"))
    row.update(digests=[s["digest"] for s in secs], peak_memory_kind=doc.get("peak_memory_kind"),
               build_s=doc.get("build_s"), warmup_s=doc.get("warmup_s"), dtype=doc.get("dtype"),
               ran_with=dict(doc.get("ran_with") or {}, compile=bool(doc.get("compile")), warm=bool(doc.get("warm")),
                             dtype=doc.get("dtype")))
    return row


def ran_with_line(label: str, r: Dict[str, object]) -> str:
    """One line: what a stock row ran with (its attention kernel, torch, transformers, flash-attn, token2wav)."""
    w = r.get("ran_with") or {}
    if not w:
        return f"{label}: ran with: not recorded"
    asked = f" (asked {w['attention_asked']})" if w.get("attention_asked") not in (None, w.get("attention")) else ""
    fa = f", flash-attn {w['flash_attn']}" if w.get("flash_attn") else ""
    return (f"{label}: ran with {w.get('attention')} attention{asked}, torch {w.get('torch')}, transformers "
            f"{w.get('transformers')}{fa}, token2wav {w.get('token2wav')}, {w.get('dtype')}"
            + (", torch.compile" if w.get("compile") else "") + (", warmed" if w.get("warm") else ""))


#: why the stock's count of sessions per device is 1 or 0 (the capacity bench's stock-loop row)
ONE_PER_WORKER = ("MiniCPM-o-Demo's worker serves one duplex session per GPU: the stock's count is 1 when that "
                  "session keeps every second on time, else 0")


def capacity_row(python: Path, folder: Path, audio: np.ndarray, work: Path, seed: int, device: str,
                 threads: int) -> Dict[str, object]:
    """The stock loop's row in ``duplexcadence-bench capacity``: one session (eager, as its users run it) over
    ``audio`` (16 kHz), paced as :func:`paced` says; ``max_sessions`` 1 when no second missed, else 0. A run
    that could not finish gives ``{"error": one line, "max_sessions": None}``."""
    seconds = -(-len(audio) // RATE)
    r = run_stock(python, folder, write_input(work, audio), work / "stock-eager", seed, seconds, device, threads,
                  compile=False)
    if "error" in r:
        return {"label": STOCK_LABELS["eager"], "error": r["error"], "max_sessions": None}
    keys = ("p50_total_ms", "p99_total_ms", "misses", "peak_memory_bytes", "peak_memory_kind", "seconds",
            "mean_speaking_second_ms", "mean_listening_second_ms", "build_s", "dtype")
    return dict({k: r.get(k) for k in keys}, label=STOCK_LABELS["eager"], why=ONE_PER_WORKER,
                max_sessions=1 if r["misses"] == 0 else 0)


def reset_peak_memory(cuda: bool) -> None:
    """Start a run's peak afresh: CUDA's peak stats, or this process's VmHWM (``/proc/self/clear_refs`` 5)."""
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory(cuda: bool) -> Optional[int]:
    if cuda:
        return int(torch.cuda.max_memory_reserved())
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def median_row(reps: List[Dict[str, object]]) -> Dict[str, object]:
    """Each metric's median over the repeats (a metric missing in any repeat stays None)."""
    out: Dict[str, object] = {}
    for m in METRICS:
        vals = [r.get(m) for r in reps]
        out[m] = None if not vals or any(v is None for v in vals) else statistics.median(vals)
    out["repeats"] = [{m: r.get(m) for m in METRICS} for r in reps]
    out["decisions"] = reps[0]["decisions"]
    if reps[-1].get("memory_map"):                     # ours on CUDA: whose reserved memory, last repeat
        out["memory_map"] = reps[-1]["memory_map"]
    for key in ("accounting", "per_second", "slowest_second"):          # ours: the first repeat's accounting and per-second counts
        if reps[0].get(key):
            out[key] = reps[0][key]
    if reps[0].get("ran_with"):                        # the stock's: what it ran with (the same every repeat)
        out["ran_with"] = reps[0]["ran_with"]
    return out


def ratio(stock: Optional[float], ours: Optional[float]) -> Optional[float]:
    return stock / ours if stock and ours else None


def _ms(x) -> str:
    return "—" if x is None else f"{x:.1f}"


def _mib(x) -> str:
    return "—" if x is None else f"{x / MIB:.0f}"


def _x(x) -> str:
    return "—" if x is None else f"{x:.2f}x"


def format_rows(rows: Dict[str, Dict[str, object]], wrap: bool = True) -> str:
    heads = ["row", "mean speaking ms", "mean listening ms", "p99 ms", "misses", "peak MiB", "speaking vs stock",
             "listening vs stock", "note"]
    body = []
    for name, r in rows.items():
        if "error" in r:
            body.append([name, "—", "—", "—", "—", "—", "—", "—", r["error"]])
            continue
        body.append([name, _ms(r["mean_speaking_second_ms"]), _ms(r["mean_listening_second_ms"]),
                     _ms(r["p99_total_ms"]), r["misses"], _mib(r["peak_memory_bytes"]),
                     _x(r.get("speaking_ratio")), _x(r.get("listening_ratio")), r.get("note", "")])
    return table(body, heads, max_widths=[44] + [None] * 7 + [44], header_width=10, wrap=wrap)


def _bits_note(eager: Dict[str, object], compiled: Dict[str, object]) -> str:
    """Whether the compile run kept the eager run's bits (each second's decision, text and waveform)."""
    a, b = eager.get("digests", []), compiled.get("digests", [])
    diff = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if diff is None and len(a) == len(b):
        return "keeps the eager stock's bits (every second's decision, text, waveform)"
    return f"does NOT keep the eager stock's bits: first differs at second {diff}"


def compare(a, base_cfg, audio: np.ndarray, modes: List[str], ours) -> int:
    """The interleaved runs and their rows (stdout table, ``bench.json`` under ``--out``); exit status.
    ``ours``: what runs our modes (the session bench: ``run_mode``, ``label``, ``LABELS``, ``account_mode``),
    handed in so this module does not import the bench that imports it."""
    from engine.audio import frames_of
    label = ours.label
    from engine.core.toggles import Toggles
    cuda = torch.device(base_cfg.device).type == "cuda"
    threads = torch.get_num_threads() if cuda else 1
    base_cfg = base_cfg if cuda else base_cfg.replace(cpu_threads=1)
    frames = frames_of(audio, RATE)[: a.seconds]
    seconds = len(frames)
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="stock-loop-"))
    wav = write_input(work, np.concatenate(frames))
    folder = Path(base_cfg.backbone_checkpoint)
    stock_modes = [m for m in STOCK_MODES if m in a.stock_loop_modes]
    reps: Dict[str, List[Dict[str, object]]] = {}
    errors: Dict[str, str] = {}
    failed: Dict[str, List[Dict[str, object]]] = {}
    for rep in range(a.stock_loop_repeats):
        for sm in stock_modes:
            if sm in errors:
                continue
            print(f"repeat {rep + 1}/{a.stock_loop_repeats}: {STOCK_LABELS[sm]}", file=sys.stderr, flush=True)
            r = run_stock(Path(a.stock_loop), folder, wav, work / f"stock-{sm}-{rep + 1}", a.seed, seconds,
                          base_cfg.device, threads, sm == "compile",
                          a.stock_loop_compile_timeout if sm == "compile" else DEFAULT_TIMEOUT_S, warm=sm == "warm",
                          attn=getattr(a, "stock_loop_attn", "auto"))
            tally_repeat(r, rep, sm, reps, errors, failed)
        for m in modes:
            t = Toggles.from_mode(m)
            cfg = base_cfg.replace(demand_sized=t.demand_sized, graph_replay=t.graph_replay)
            print(f"repeat {rep + 1}/{a.stock_loop_repeats}: ours, {ours.LABELS[m]}", file=sys.stderr, flush=True)
            r = _ours(a, ours, cfg, frames, m, rep, cuda)
            reps.setdefault(f"ours: {label(m, r.pop('records'))}", []).append(r)
    rows = build_rows(reps, errors, stock_modes, failed)
    print(textwrap.fill(f"MiniCPM-o 4.5, {base_cfg.device}, {seconds} s of 16 kHz input, seed {a.seed}, "
                        f"{a.stock_loop_repeats} interleaved repeat(s), medians; folder {folder}", 120))
    print(format_rows(rows))
    kind = ("torch.cuda.max_memory_reserved (the stock's whole process; ours from the start of its build on)"
            if cuda else "the process's peak RSS (VmHWM)")
    print(f"peak memory: {kind}; ratio: the stock eager row's ms / the row's ms (above 1: faster than the stock)")
    for sm in stock_modes:
        if "error" not in rows[STOCK_LABELS[sm]]:
            print(textwrap.fill(ran_with_line(STOCK_LABELS[sm], rows[STOCK_LABELS[sm]]), 120))
    for name, row in rows.items():
        if row.get("slowest_second"):
            print(textwrap.fill(ours.format_slowest(name, row["slowest_second"]), 120))
    accounts = {name: row["accounting"] for name, row in rows.items() if row.get("accounting")}
    if accounts:
        print(accounting.format_table(accounts))
        kernels = accounting.format_kernels(accounts)
        if kernels:
            print(kernels)
        print(textwrap.fill(accounting.note(cuda), 120))
    for name, row in rows.items():
        if row.get("memory_map"):
            print(memory_map.format_map(name, row["memory_map"]))
    doc = {"seconds": seconds, "seed": a.seed, "repeats": a.stock_loop_repeats, "device": base_cfg.device,
           "folder": str(folder), "threads": threads, "peak_memory": kind, "ahead": a.ahead, "rows": rows,
           "reference": STOCK_LABELS["eager"], "torch": torch.__version__,
           "stock_attention_asked": getattr(a, "stock_loop_attn", "auto"),
           "stock_ran_with": {STOCK_LABELS[sm]: rows[STOCK_LABELS[sm]].get("ran_with") for sm in stock_modes},
           "gpu": torch.cuda.get_device_name(0) if cuda else "cpu"}
    text = json.dumps(doc, indent=1)
    try:
        atomic_write(work / "bench.json", lambda f: f.write(text), text=True)
    except OSError as e:
        print(f"duplexcadence-bench session: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {work / 'bench.json'}", file=sys.stderr)
    return 0 if "eager" not in errors or "eager" not in stock_modes else 1


def _ours(a, ours, cfg, frames, mode: str, rep: int, cuda: bool) -> Dict[str, object]:
    """One run of our ``mode`` (``ours``: the session bench's ``run_mode`` etc.): its row, with ``records``, the
    memory map, and in the first repeat (``--account-seconds``) the per-second accounting; under ``--out`` its
    per-second records. Peak memory counts the build too, as the stock's whole process does."""
    from engine.session import export_records
    reset_peak_memory(cuda)
    run = ours.run_mode(cfg, frames, desc=ours.LABELS[mode], quiet=a.quiet, digests=False, ahead=a.ahead)
    recs, summ = run["records"], run["summary"]
    peak = peak_memory(cuda)
    if cuda and peak is not None:
        peak = max(peak, int(summ.get("build_peak_reserved_bytes") or 0))
    r = row_of([x.total_ms for x in recs], [x.decision for x in recs], peak)
    r["memory_map"], r["records"] = summ.get("memory_map"), recs
    # where a slow second's time went, second by second: graphs captured, graph launches, garbage collection
    r["per_second"] = {"captures": run["captures"], "replays": run["replays"],
                       "gc_ms": [round(x, 3) for x in run["gc_ms"]]}
    if recs:
        r["slowest_second"] = ours.slowest_second(run)
    if a.out:
        export_records(recs, Path(a.out), stem=f"session-{mode}-{rep + 1}")
    if (a.account_seconds or a.account_at) and rep == 0:     # a separate profiled run, never in the timed one
        r["accounting"] = ours.account_mode(cfg, frames, run, a.account_seconds, a.ahead, a.account_at)
    return r


def tally_repeat(r: Dict[str, object], rep: int, sm: str, reps: Dict[str, List[Dict[str, object]]],
                 errors: Dict[str, str], failed: Dict[str, List[Dict[str, object]]]) -> None:
    """File one stock run (``r``, repeat ``rep`` counted from 0, mode ``sm``): a good run joins ``reps``; a failed
    one goes to ``failed`` when the mode has good repeats already (the row stays their median and says so), else
    to ``errors``, which ends the mode (a first failure repeats: the compile time-out, a broken folder)."""
    if "error" not in r:
        reps.setdefault(STOCK_LABELS[sm], []).append(r)
    elif STOCK_LABELS[sm] in reps:
        failed.setdefault(sm, []).append({"repeat": rep + 1, "error": r["error"]})
    else:
        errors[sm] = r["error"]


def _stock_row(sm: str, reps: Dict[str, List[Dict[str, object]]], errors: Dict[str, str],
               failed: Dict[str, List[Dict[str, object]]]) -> Dict[str, object]:
    name = STOCK_LABELS[sm]
    if name not in reps:
        return {"error": errors.get(sm, "not measured: no repeat ran")}
    row = median_row(reps[name])
    if failed.get(sm):
        n = len(reps[name])
        row["failed_repeats"] = failed[sm]
        row["note"] = (f"median of {n} of {n + len(failed[sm])} repeats; "
                       + "; ".join(f"repeat {f['repeat']} {f['error']}" for f in failed[sm]))[:300]
    return row


def build_rows(reps: Dict[str, List[Dict[str, object]]], errors: Dict[str, str],
               stock_modes: List[str], failed: Optional[Dict[str, List[Dict[str, object]]]] = None
               ) -> Dict[str, Dict[str, object]]:
    """Median rows in order (the stock's, then ours), each of ours with its ratios against the stock eager row,
    the compile row with whether it kept the eager run's bits; a row that could not run carries ``error``; a
    stock row whose later repeats failed (``failed``) is the median of its good ones and names the others."""
    rows: Dict[str, Dict[str, object]] = {}
    for sm in stock_modes:
        rows[STOCK_LABELS[sm]] = _stock_row(sm, reps, errors, failed or {})
    eager = rows.get(STOCK_LABELS["eager"], {})
    if "compile" in stock_modes and "error" not in rows[STOCK_LABELS["compile"]] and "error" not in eager:
        note = _bits_note(reps[STOCK_LABELS["eager"]][0], reps[STOCK_LABELS["compile"]][0])
        row = rows[STOCK_LABELS["compile"]]
        row.update(note="; ".join(filter(None, (note, row.get("note")))), keeps_bits=note.startswith("keeps"))
    warm = rows.get(STOCK_LABELS["warm"], {})
    warm = {} if "error" in warm else warm              # a warmed row that could not run gives no ratios
    if warm:
        warm["note"] = "; ".join(filter(None, ("after one earlier 10 s session in the same process (a serving "
                                              "worker's later session)", warm.get("note"))))
    for name, r in reps.items():
        if name.startswith("ours: "):
            row = median_row(r)
            row["speaking_ratio"] = ratio(eager.get("mean_speaking_second_ms"), row["mean_speaking_second_ms"])
            row["listening_ratio"] = ratio(eager.get("mean_listening_second_ms"), row["mean_listening_second_ms"])
            notes = []
            if "decisions" in eager:
                same = sum(x == y for x, y in zip(eager["decisions"], row["decisions"]))
                notes.append(f"decisions as the stock eager's: {same} of {len(row['decisions'])} s")
            if warm:
                row["speaking_ratio_warm"] = ratio(warm.get("mean_speaking_second_ms"),
                                                   row["mean_speaking_second_ms"])
                row["listening_ratio_warm"] = ratio(warm.get("mean_listening_second_ms"),
                                                    row["mean_listening_second_ms"])
                notes.append(f"vs the warmed stock: {_x(row['speaking_ratio_warm'])} speaking, "
                             f"{_x(row['listening_ratio_warm'])} listening")
            row["note"] = "; ".join(notes)
            rows[name] = row
    return rows
