"""`duplexcadence-bench step-audio2`: the stock token2wav package vs our three modes, one run, one GPU.

Same seeded random weights (released dims by default), same 6 s prompt, tokens, flow noise and seed for
all. Per mode: ms per 1 s chunk (median / p90 over the steady chunks, and the first chunk), kernels and
GPU kernel time per steady chunk (torch.profiler over a separate short stream), max_memory_reserved /
max_memory_allocated, state bytes, and torch.equal of every chunk's audio with the stock package's.

The stock package (PyPI ``minicpmo``, module ``stepaudio2``) is loaded through the test oracle loader
(tests/stock_step_audio2.py); the engine's own decoder never imports it.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import torch

from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.config import preset
from engine.models.step_audio2.dit import SelfAttention
from engine.models.step_audio2.prompt import synthetic_prompt
from engine.models.step_audio2.stream import Session, flow_noise, schedule

STEADY_FROM = 3          # chunks before this are start-up (own shapes, eager in graph mode)


def _oracle():
    path = Path(__file__).resolve().parents[2] / "tests" / "stock_step_audio2.py"
    if not path.is_file():
        raise SystemExit(f"the stock loader {path} is missing (run from a source checkout)")
    spec = importlib.util.spec_from_file_location("stock_step_audio2", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["stock_step_audio2"] = mod
    spec.loader.exec_module(mod)
    return mod


def _tokens(n_chunks: int, seed: int) -> List[int]:
    # n_chunks full chunks, then a short last chunk (4 tokens)
    g = torch.Generator().manual_seed(seed + 7)
    return torch.randint(0, 6561, (25 * n_chunks + 4,), generator=g).tolist()


def _stats(times: List[float]) -> Dict[str, float]:
    steady = sorted(times[STEADY_FROM:-1]) or sorted(times)
    return {"median_ms": 1e3 * statistics.median(steady), "p90_ms": 1e3 * steady[int(0.9 * (len(steady) - 1))],
            "first_ms": 1e3 * times[0], "steady_chunks": len(steady)}


def _profile(run_chunk: Callable[[int], None], chunks: range) -> Dict[str, float]:
    from torch.profiler import ProfilerActivity, profile
    _sync()
    acts = [ProfilerActivity.CUDA] if DEVICE == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for i in chunks:
            run_chunk(i)
        _sync()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    n = len(chunks)
    by_name: Dict[str, List[float]] = {}
    for e in ev:
        by_name.setdefault(e.name, []).append(e.device_time)
    top = sorted(((sum(v) / n / 1e3, len(v) / n, k[:90]) for k, v in by_name.items()), reverse=True)[:25]
    return {"kernels_per_chunk": len(ev) / n, "kernel_ms_per_chunk": sum(e.device_time for e in ev) / n / 1e3,
            "top_kernels": [{"ms": round(a, 3), "count": round(b, 1), "name": c} for a, b, c in top]}


DEVICE = "cuda"


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _fresh():
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _memory(res: Dict) -> None:
    cuda = DEVICE == "cuda"
    res["max_memory_reserved_MiB"] = torch.cuda.max_memory_reserved() / 2 ** 20 if cuda else float("nan")
    res["max_memory_allocated_MiB"] = torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else float("nan")


def run_stock(S, cfg, state, prompt, tokens, seed, profile_chunks) -> Dict:
    _fresh()
    flow, hift = S.build_flow(cfg.flow), S.build_hift(cfg.hift)
    flow.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("flow.")}, strict=True)
    hift.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("hift.")}, strict=True)
    st = S.StockStream(flow, hift, prompt.tokens, prompt.mel[0], prompt.spk, DEVICE, noise=flow_noise(seed))
    torch.manual_seed(seed)
    chunks = list(st.chunks(tokens))
    outs, times = [], []
    for c, last in chunks:
        _sync()
        t0 = time.perf_counter()
        wav = st.t2w.stream(c, None, last_chunk=last, return_waveform=True)
        times.append(time.perf_counter() - t0)
        outs.append(np.asarray(wav, dtype=np.float32).reshape(-1))
    res = {"mode": "stock package", **_stats(times)}
    _memory(res)
    bufs = sum(b.numel() * b.element_size() for m in (flow, hift) for b in m.buffers())
    live = sum(v.numel() * v.element_size() for v in st.t2w.stream_cache.values())
    res["state_MiB"] = (bufs + live) / 2 ** 20
    # kernels: a second short stream, steady chunks profiled
    st2 = S.StockStream(flow, hift, prompt.tokens, prompt.mel[0], prompt.spk, DEVICE, noise=flow_noise(seed))
    torch.manual_seed(seed)
    short = chunks[:STEADY_FROM + profile_chunks]
    for c, last in short[:STEADY_FROM]:
        st2.t2w.stream(c, None, last_chunk=False, return_waveform=True)
    res.update(_profile(lambda i: st2.t2w.stream(short[i][0], None, last_chunk=False, return_waveform=True),
                        range(STEADY_FROM, len(short))))
    del st, st2, flow, hift
    return res, outs


def run_ours(cfg, state, prompt, tokens, seed, mode, profile_chunks) -> Dict:
    # "MODE@stocklayout": the DiT attention in the stock's memory layout (a diagnostic variant)
    label, mode = mode, mode.split("@")[0]
    SelfAttention.rows_ln = SelfAttention.strided_kv = not label.endswith("@stocklayout")
    _fresh()
    model = W.build(cfg, state, DEVICE)
    sched = schedule(len(tokens))
    t_build = time.perf_counter()
    sess = Session(model, prompt, len(sched), sched[-1][1], mode, seed)
    setup_s = time.perf_counter() - t_build
    outs, times = [], []
    for start, n, _ in sched:
        _sync()
        t0 = time.perf_counter()
        audio = sess.run(tokens[start:start + n]).cpu().numpy()
        times.append(time.perf_counter() - t0)
        outs.append(audio.reshape(-1))
    res = {"mode": label, **_stats(times), "setup_s": setup_s, "graphs": sess.graphs}
    _memory(res)
    res["state_MiB"] = sess.state_bytes() / 2 ** 20
    res["replayed"] = sess.executor.stats.replayed_steps
    # kernels: a second short session (open-ended plan: every chunk's signature captured in graph mode)
    del sess
    sess2 = Session(model, prompt, None, None, mode, seed)
    for start, n, _ in sched[:STEADY_FROM]:
        sess2.run(tokens[start:start + n])
    k0 = STEADY_FROM
    res.update(_profile(lambda i: sess2.run(tokens[25 * i:25 * i + 28]), range(k0, k0 + profile_chunks)))
    del sess2, model
    return res, outs


def table(rows: List[Dict]) -> str:
    stock = rows[0]
    lines = ["| mode | median ms/chunk | p90 ms | first ms | speed-up (median) | kernels/chunk | GPU kernel ms/chunk "
             "| max reserved MiB | vs stock | state MiB | bit-identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {r['first_ms']:.0f} "
            f"| {stock['median_ms'] / r['median_ms']:.2f}x | {r['kernels_per_chunk']:.0f} | {r['kernel_ms_per_chunk']:.1f} "
            f"| {r['max_memory_reserved_MiB']:.0f} | {100 * (1 - r['max_memory_reserved_MiB'] / stock['max_memory_reserved_MiB']):+.0f}% "
            f"| {r['state_MiB']:.1f} | {r.get('bit_identical', 'reference')} |")
    return "\n".join(lines)


def main(argv) -> int:
    p = argparse.ArgumentParser(prog="duplexcadence-bench step-audio2", description=__doc__)
    p.add_argument("--chunks", type=int, default=40, help="full 1 s chunks (a short last chunk follows)")
    p.add_argument("--size", default="released", choices=["released", "tiny", "oracle"])
    p.add_argument("--prompt-seconds", type=float, default=6.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="stock,demand,graphs")
    p.add_argument("--profile-chunks", type=int, default=3)
    p.add_argument("--math", default="default", choices=["default", "tf32-off"],
                   help="default: PyTorch's defaults (cuDNN TF32 on, matmul TF32 off), as the stock package "
                        "runs; tf32-off: TF32 off everywhere")
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)    # cpu: a dry run of the harness
    a = p.parse_args(argv)
    global DEVICE
    DEVICE = a.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("duplexcadence-bench step-audio2: needs a CUDA device", file=sys.stderr)
        return 2
    # the same math settings for the stock package and ours; cuDNN restricted to deterministic
    # algorithms (the HiFT's transposed convs otherwise may pick atomics-based ones: not even the stock
    # package is then reproducible run to run)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if a.math == "tf32-off":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    S = _oracle()
    cfg = preset(a.size)
    state = W.random_state_dict(cfg, a.seed)
    prompt = synthetic_prompt(a.prompt_seconds, a.seed)
    tokens = _tokens(a.chunks, a.seed)
    rows, ref = [], None
    r, ref = run_stock(S, cfg, state, prompt, tokens, a.seed, a.profile_chunks)
    rows.append(r)
    print(json.dumps(r), flush=True)
    for mode in a.modes.split(","):
        r, outs = run_ours(cfg, state, prompt, tokens, a.seed, mode, a.profile_chunks)
        same = [bool(np.array_equal(x, y)) for x, y in zip(outs, ref)] if len(outs) == len(ref) else [False]
        r["bit_identical"] = all(same)
        r["chunks_identical"] = f"{sum(same)}/{len(ref)}"
        if not all(same):
            i = same.index(False)
            r["first_mismatch"] = {"chunk": i, "max_abs": float(np.abs(outs[i] - ref[i]).max())
                                   if outs[i].shape == ref[i].shape else "shape"}
        rows.append(r)
        print(json.dumps(r), flush=True)
    meta = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__, "size": a.size,
            "chunks": len(ref), "prompt_s": a.prompt_seconds, "seed": a.seed, "math": a.math,
            "cudnn_tf32": torch.backends.cudnn.allow_tf32, "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_deterministic": True}
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0
