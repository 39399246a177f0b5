"""`duplexcadence-bench step-audio2`: the stock token2wav package vs our modes, interleaved in one run, one GPU.

Same seeded random weights (released dims by default), same 6 s prompt, tokens, flow noise and seed for
every variant. Each variant is its own stream (its own modules, caches and random-generator state); chunk
by chunk, every variant runs its next chunk in turn (the order rotates each chunk), so all of them see the
same machine at the same moments. Reported per variant: ms per 1 s chunk (median / p90 over the steady
chunks, the first chunk), kernels and GPU kernel time per chunk (torch.profiler over the last steady
chunks, which are not timed), memory resident after building and the peak working memory of a chunk,
state bytes, and torch.equal of every chunk's audio against the stock package with deterministic cuDNN.

Variants: the stock package as its users run it (PyTorch's default cuDNN settings: non-deterministic
algorithms allowed), the stock package with deterministic cuDNN (the bit reference: with the defaults it
does not repeat its own bits), and ours in each mode: ``graphs`` (demand-sized state, CUDA graph
replay), ``demand`` (demand-sized, eager), ``stock-like`` (our code with the stock's state policy). Our
sessions always run with deterministic cuDNN (as the app runs them). The headline is the stock as users
run it over ours ``graphs``; the deterministic-cuDNN ratio comes second.

The stock package (PyPI ``minicpmo``, module ``stepaudio2``) is loaded through the test oracle loader
(tests/stock_step_audio2.py); the engine's own decoder never imports it.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from engine.cli.validate import OneLineParser
from engine.bench import accounting, report
from engine.bench.mathmode import tf32_off
from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.config import preset
from engine.models.step_audio2.prompt import synthetic_prompt
from engine.models.step_audio2.stream import Session, flow_noise, schedule
from engine.stats import percentile, progress, table

STEADY_FROM = 3          # chunks before this are start-up (own shapes, eager in graph mode)
TOP = 15                 # kernels by summed time in the JSON's ``top_kernels_per_chunk``
PROG = "duplexcadence-bench step-audio2"
STOCK_USERS, STOCK_DET = "stock package", "stock package, deterministic cuDNN"
OUR_MODES = {"graphs": "graphs", "demand": "demand", "stock-like": "stock", "stock": "stock",
             "graphs-reference": "graphs"}


def _oracle():
    path = Path(__file__).resolve().parents[2] / "tests" / "stock_step_audio2.py"
    if not path.is_file():
        raise SystemExit(f"{PROG}: the stock loader {path} is missing (run from a source checkout)")
    spec = importlib.util.spec_from_file_location("stock_step_audio2", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["stock_step_audio2"] = mod
    spec.loader.exec_module(mod)
    if not mod.available():
        raise SystemExit(f"{PROG}: the stock package is not installed "
                         "(pip install --no-deps -r tests/oracle-requirements.txt)")
    return mod


def _tokens(n_chunks: int, seed: int) -> List[int]:
    # n_chunks full chunks, then a short last chunk (4 tokens)
    g = torch.Generator().manual_seed(seed + 7)
    return torch.randint(0, 6561, (25 * n_chunks + 4,), generator=g).tolist()


class Variant:
    """One stream under test: its own modules, caches, generator state and cuDNN settings."""

    def __init__(self, label: str, device: torch.device, deterministic: bool):
        self.label, self.device, self.deterministic = label, device, deterministic
        self.times: List[float] = []
        self.outs: List[np.ndarray] = []
        self.work_peak = 0
        self.resident = 0
        self._rng: Optional[tuple] = None
        self.info: Dict[str, object] = {}

    def save_rng(self) -> None:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        self._rng = (torch.get_rng_state(), cuda)

    def enter(self) -> None:
        """Make the process look as this variant's users run it: its cuDNN settings, its generator."""
        torch.backends.cudnn.deterministic = self.deterministic
        torch.backends.cudnn.benchmark = False
        cpu, cuda = self._rng
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, self.device)

    def chunk(self, i: int) -> np.ndarray:
        raise NotImplementedError

    def state_bytes(self) -> int:
        raise NotImplementedError


class StockVariant(Variant):
    def __init__(self, S, cfg, state, prompt, tokens, seed, device, deterministic):
        super().__init__(STOCK_DET if deterministic else STOCK_USERS, device, deterministic)
        flow, hift = S.build_flow(cfg.flow), S.build_hift(cfg.hift)
        flow.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("flow.")}, strict=True)
        hift.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("hift.")}, strict=True)
        self.st = S.StockStream(flow, hift, prompt.tokens, prompt.mel[0], prompt.spk, device,
                                noise=flow_noise(seed))
        self.chunks = list(self.st.chunks(tokens))
        torch.manual_seed(seed)
        self.save_rng()

    def chunk(self, i: int) -> np.ndarray:
        c, last = self.chunks[i]
        wav = self.st.t2w.stream(c, None, last_chunk=last, return_waveform=True)
        return np.asarray(wav, dtype=np.float32).reshape(-1)

    def state_bytes(self) -> int:
        bufs = sum(b.numel() * b.element_size() for m in (self.st.flow, self.st.hift) for b in m.buffers())
        live = sum(v.numel() * v.element_size() for v in self.st.t2w.stream_cache.values())
        return bufs + live


class OurVariant(Variant):
    """``graphs-reference``: graphs with every optional faster path on its reference (the "before")."""

    def __init__(self, cfg, state, prompt, tokens, seed, device, mode):
        label = "ours graphs, reference paths" if mode == "graphs-reference" else f"ours {mode}"
        super().__init__(label, device, deterministic=True)
        self.model = W.build(cfg, state, device)
        if mode == "graphs-reference":
            self.model.use_reference_paths()
        self.tokens = tokens
        self.sched = schedule(len(tokens))
        t0 = time.perf_counter()
        self.sess = Session(self.model, prompt, len(self.sched), self.sched[-1][1], OUR_MODES[mode], seed)
        self.info = {"setup_s": time.perf_counter() - t0, "graphs": self.sess.graphs,
                     "fast_paths": [v.line() for v in self.model.verdicts()]}
        self.save_rng()

    def chunk(self, i: int) -> np.ndarray:
        start, n, _ = self.sched[i]
        return self.sess.run(self.tokens[start:start + n]).cpu().numpy().reshape(-1)

    def state_bytes(self) -> int:
        return self.sess.state_bytes()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _build(make: Callable[[], Variant], device: torch.device) -> Variant:
    gc.collect()
    _sync(device)
    before = _allocated(device)
    v = make()
    _sync(device)
    v.resident = _allocated(device) - before
    return v


def _run_chunk(v: Variant, i: int, timed: bool) -> None:
    """Variant ``v`` runs chunk ``i``: timed (sync, chunk, sync) or under the profiler."""
    dev = v.device
    v.enter()
    _sync(dev)
    before = _allocated(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if timed:
        t0 = time.perf_counter()
        out = v.chunk(i)
        _sync(dev)
        v.times.append(time.perf_counter() - t0)
    else:
        out, prof = _profiled(lambda: v.chunk(i), dev)
        v.info.setdefault("profiled", []).append(prof)
    if dev.type == "cuda":
        v.work_peak = max(v.work_peak, torch.cuda.max_memory_allocated(dev) - before)
    v.outs.append(out)
    v.save_rng()


def _profiled(fn: Callable[[], np.ndarray], dev: torch.device):
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CUDA] if dev.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        out = fn()
        _sync(dev)
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return out, (len(ev), sum(e.device_time for e in ev) / 1e3, device_tally(ev))


def device_tally(events) -> accounting.Tally:
    """The chunk's device events by shortened name: {name: (how many, summed ms)} (where its time went)."""
    raw: Dict[str, List[float]] = {}
    for e in events:
        acc = raw.setdefault(e.name, [0, 0.0])
        acc[0] += 1
        acc[1] += e.device_time / 1e3
    return accounting.by_name({k: (n, ms) for k, (n, ms) in raw.items()})


def summarize(v: Variant) -> Dict[str, object]:
    steady = v.times[STEADY_FROM:] or v.times
    ms = [1e3 * t for t in steady]
    prof = v.info.get("profiled", [])
    cuda = v.device.type == "cuda"
    row = {"variant": v.label, "median_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90),
           "first_ms": 1e3 * v.times[0] if v.times else float("nan"), "steady_chunks": len(ms),
           "kernels_per_chunk": float(np.mean([p[0] for p in prof])) if prof else float("nan"),
           "kernel_ms_per_chunk": float(np.mean([p[1] for p in prof])) if prof else float("nan"),
           "top_kernels_per_chunk": (accounting.top_kernels(accounting.mean_tally([p[2] for p in prof]), TOP)
                                     if prof and cuda else None),
           "resident_MiB": v.resident / 2 ** 20 if cuda else float("nan"),
           "work_peak_MiB": v.work_peak / 2 ** 20 if cuda else float("nan"),
           "state_MiB": v.state_bytes() / 2 ** 20, "cudnn_deterministic": v.deterministic,
           "ms_per_chunk": [round(1e3 * t, 3) for t in v.times]}
    row.update({k: val for k, val in v.info.items() if k != "profiled"})
    return row


def _compare(v: Variant, ref: Variant) -> Dict[str, object]:
    same = [bool(np.array_equal(x, y)) for x, y in zip(v.outs, ref.outs)] if len(v.outs) == len(ref.outs) else [False]
    out: Dict[str, object] = {"bit_identical": all(same), "chunks_identical": f"{sum(same)}/{len(ref.outs)}"}
    if not all(same):
        i = same.index(False)
        a, b = v.outs[i], ref.outs[i]
        out["first_mismatch"] = {"chunk": i, "max_abs": float(np.abs(a - b).max()) if a.shape == b.shape else "shape"}
    return out


def headline(rows: List[Dict], ours: str = "ours graphs") -> Dict[str, float]:
    """Ratios of median ms per chunk, and the median of the chunk-by-chunk (paired) ratios."""
    by = {r["variant"]: r for r in rows}
    out = {}
    if ours not in by:
        return out
    o = by[ours]
    for key, stock in (("vs_stock_as_users_run_it", STOCK_USERS), ("vs_stock_deterministic_cudnn", STOCK_DET)):
        if stock in by:
            s = by[stock]
            out[key] = s["median_ms"] / o["median_ms"]
            pairs = [a / b for a, b in zip(s["ms_per_chunk"][STEADY_FROM:], o["ms_per_chunk"][STEADY_FROM:]) if b > 0]
            out[key + "_paired"] = percentile(pairs, 50)
    before = by.get("ours graphs, reference paths")
    if before is not None:                              # the faster paths' before/after, side by side
        out["faster_paths_speedup"] = before["median_ms"] / o["median_ms"]
    return out


def markdown_table(rows: List[Dict], wrap: bool = True) -> str:
    """The results as an aligned markdown table (``wrap``: fits 120 columns)."""
    ref = rows[0]

    def num(x: float, fmt: str) -> str:
        return "—" if x != x else format(x, fmt)            # NaN (not measured here) -> a dash
    heads = ["variant", "median ms", "p90 ms", "first ms", "vs stock", "kernel count", "kernel ms", "kept MiB",
             "work MiB", "state MiB", "bits equal"]
    body = [[r["variant"], num(r["median_ms"], ".1f"), num(r["p90_ms"], ".1f"), num(r["first_ms"], ".0f"),
             f"{ref['median_ms'] / r['median_ms']:.2f}x", num(r["kernels_per_chunk"], ".0f"),
             num(r["kernel_ms_per_chunk"], ".1f"), num(r["resident_MiB"], ".0f"), num(r["work_peak_MiB"], ".0f"),
             num(r["state_MiB"], ".1f"), str(r.get("bit_identical", "reference"))] for r in rows]
    return table(body, heads, max_widths=[16] + [None] * 10, header_width=[None] + [6] * 10,
                 wrap=wrap)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=40, help="full 1 s chunks (a short last chunk follows)")
    p.add_argument("--size", default="released", choices=["released", "tiny", "oracle"])
    p.add_argument("--prompt-seconds", type=float, default=6.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="stock-like,demand,graphs",
                   help="our modes: graphs, demand, stock-like, graphs-reference (graphs with every checked "
                        "faster path on its reference path: the faster paths' before/after)")
    p.add_argument("--no-stock-default", action="store_true",
                   help="leave out the stock package with its default cuDNN settings")
    p.add_argument("--profile-chunks", type=int, default=2, help="steady chunks profiled (not timed) at the end")
    p.add_argument("--math", default="default", choices=["default", "tf32-off"],
                   help="default: PyTorch's defaults (cuDNN TF32 on, matmul TF32 off), as the stock package "
                        "runs; tf32-off: TF32 off everywhere")
    p.add_argument("--json", default="bench-results/step-audio2.json",
                   help="results as JSON here; the markdown table (.md) and the plot (.png) go next to it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)    # cpu: a dry run of the harness
    return p


def _problem(a, modes: List[str]) -> Optional[str]:
    """Why the arguments cannot run (None: they can)."""
    bad = [m for m in modes if m not in OUR_MODES]
    if bad:
        return f"error: unknown mode(s) {bad}"
    if a.chunks < STEADY_FROM + a.profile_chunks + 1 or a.profile_chunks < 0:
        return f"error: --chunks must be at least {STEADY_FROM + a.profile_chunks + 1} (start-up + profiled + one timed)"
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        return "needs a CUDA device"
    return None


def _makers(a, modes: List[str], device: torch.device, tokens: List[int]) -> List[Callable[[], Variant]]:
    """The variants, as a table: the stock as users run it (unless left out), the deterministic stock (the bit
    reference), then ours in each mode asked; all on the same weights, prompt, tokens and seed."""
    S, cfg = _oracle(), preset(a.size)
    state, prompt = W.random_state_dict(cfg, a.seed), synthetic_prompt(a.prompt_seconds, a.seed)
    stock = [] if a.no_stock_default else [False]
    return ([lambda d=d: StockVariant(S, cfg, state, prompt, tokens, a.seed, device, deterministic=d)
             for d in stock + [True]]
            + [lambda m=m: OurVariant(cfg, state, prompt, tokens, a.seed, device, "stock-like" if m == "stock" else m)
               for m in modes])


def _interleaved(variants: List[Variant], n: int, profiled: range, quiet: bool) -> None:
    """Every variant runs chunk i in turn (the order rotating) before any runs chunk i + 1."""
    with progress(n, desc="chunks (all variants in turn)", unit="chunk", quiet=quiet) as bar:
        for i in range(n):
            for v in variants[i % len(variants):] + variants[:i % len(variants)]:
                _run_chunk(v, i, timed=i not in profiled)
            bar.update()


def _rows(variants: List[Variant]) -> tuple:
    """(a row per variant, compared with the deterministic stock; the fast-path lines of ours)."""
    ref = next(v for v in variants if v.label == STOCK_DET)
    paths: List[str] = []
    for v in variants:
        if isinstance(v, OurVariant):                   # a short last chunk adds its own checks
            v.info["fast_paths"] = [x.line() for x in v.model.verdicts()]
            if not paths and "reference" not in v.label:
                paths = v.info["fast_paths"]
    rows = []
    for v in variants:
        v.times = v.times[:-1]                          # the short last chunk is not a 1 s chunk
        row = summarize(v)
        if v is not ref:
            row.update(_compare(v, ref))
        rows.append(row)
    return rows, paths


#: the headline lines: (ratio key, words, digits)
HEADLINES = (("vs_stock_as_users_run_it", "ours graphs vs the stock package as users run it", 2),
             ("vs_stock_deterministic_cudnn", "ours graphs vs the stock package with deterministic cuDNN", 2),
             ("faster_paths_speedup", "ours graphs with the checked faster paths vs on the reference paths", 3))


def _lines(ratios: Dict[str, float], paths: List[str]) -> List[str]:
    out = []
    for key, words, digits in HEADLINES:
        if key in ratios:
            paired = f" (paired {ratios[key + '_paired']:.2f}x)" if key + "_paired" in ratios else ""
            out.append(f"{words}: {ratios[key]:.{digits}f}x{paired}")
    return out + [f"faster path {p}" for p in paths]


def _notes(n: int, profile_chunks: int) -> List[str]:
    return [
        "Interleaved: every variant runs chunk i in turn (order rotating) before any runs chunk i+1; medians "
        f"over chunks {STEADY_FROM}..{n - 2 - profile_chunks} (start-up chunks, profiled chunks and the short "
        "last chunk left out).",
        "The bit reference is the stock package with deterministic cuDNN: with its default cuDNN settings the "
        "stock does not repeat its own bits on CUDA.",
        "vs stock: the stock package as users run it over this row (median ms per chunk); kernel count, kernel ms: "
        "CUDA kernels and their summed GPU time per chunk (profiled chunks); kept MiB: memory allocated by building "
        "the variant (weights + state); work MiB: the most a chunk allocated on top of what was allocated "
        "before it; bits equal: torch.equal to the stock with deterministic cuDNN."]


def _figure(rows: List[Dict]) -> report.Figure:
    return report.Figure([
        report.Bars("ms per 1 s chunk (steady)", "ms", [r["variant"] for r in rows],
                    {"median": [r["median_ms"] for r in rows], "p90": [r["p90_ms"] for r in rows]},
                    hline=(1000.0, "1 s budget") if max(r["p90_ms"] for r in rows) > 700 else None),
        report.Lines("ms per chunk, interleaved", "chunk", "ms", {r["variant"]: r["ms_per_chunk"] for r in rows})])


def main(argv) -> int:
    argv = list(argv)
    a = build_parser().parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if a.device == "cpu":
        a.profile_chunks = 0                            # kernel counts are a CUDA measurement
    why = _problem(a, modes)
    if why:
        print(f"{PROG}: {why}", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    if a.math == "tf32-off":
        tf32_off()
    tokens = _tokens(a.chunks, a.seed)
    makers = _makers(a, modes, device, tokens)
    with progress(len(makers), desc="building", unit="variant", quiet=a.quiet) as bar:
        variants = []
        for make in makers:
            variants.append(_build(make, device))
            bar.update()
    n = len(schedule(len(tokens)))                      # full chunks + the short last one
    profiled = range(n - 1 - a.profile_chunks, n - 1)
    _interleaved(variants, n, profiled, a.quiet)
    rows, paths = _rows(variants)
    ratios = headline(rows)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "size": a.size, "chunks": n, "prompt_s": a.prompt_seconds, "seed": a.seed,
            "math": a.math, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_tf32": torch.backends.cuda.matmul.allow_tf32, "interleaved": True,
            "steady_chunks_from": STEADY_FROM, "profiled_chunks": list(profiled)}
    lines = _lines(ratios, paths)
    print(markdown_table(rows))
    for line in lines:
        print(textwrap.fill(line, 120, subsequent_indent="  "))   # a cached verdict's line runs past 120
    command = report.command_line(PROG, argv)
    md = report.markdown("Step-Audio2 token2wav: stock package vs ours", command,
                         [("", markdown_table(rows, wrap=False))], lines + _notes(n, a.profile_chunks))
    try:
        written = report.write_all(Path(a.json), {"meta": meta, "headline": ratios, "rows": rows}, md,
                                   _figure(rows), command=command)
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0
