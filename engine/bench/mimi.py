"""`duplexcadence-bench mimi`: moshi's own Mimi (eager, CUDA graphs) vs our modes, one run, same weights.

Both sides decode the same seeded random codes with the same seeded random weights at the given
size. moshi (installed with --no-deps, imported only here and in tests) decodes one frame per
call in ``mimi.streaming(1)``, as Moshi does; we decode whole seconds (12 or 13 frames per step).
Each audio second is timed as a block (sync, the second's frames, sync) and divided by its audio
length. Reported: ms per audio second (median, p90), CUDA kernels and kernel time per audio second
(profiler, eager paths), peak memory, state bytes, and bit-identity with moshi (torch.equal).
moshi on CUDA wraps RoPE in ``torch.compile``; the bit reference is moshi with that compile off
(its eager arithmetic); the compiled variant is timed and compared too. "ours graphs" runs the order
the start-up self-check chose on this GPU (``engine/models/mimi/fastpaths.py``: each faster order
against the frame-major reference, bit for bit; its verdicts and time are in the config). Our graph
replay is also timed in every order explicitly: frame-major (the reference), layer-major with
per-frame library calls, and with per-second matmuls / convs (``engine/models/mimi/second.py``).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import types
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List, Optional

import torch

from engine.cli.validate import OneLineParser
from engine.bench import accounting, report
from engine.bench.mathmode import tf32_off
from engine.core import Executor
from engine.core.toggles import MODES, Toggles
from engine.stats import percentile, progress
from engine.stats import table as stats_table

from engine.models.mimi import weights as W
from engine.models.mimi.config import MimiConfig, preset
from engine.models.mimi.fastpaths import choose
from engine.models.mimi.model import MimiDecoder


# -- the peer (moshi) ---------------------------------------------------------------------------------
def _stub_unused_imports() -> None:
    """moshi's loaders import download/tokenizer/file helpers the decode path never calls."""
    def missing(top: str) -> bool:
        return top not in sys.modules and importlib.util.find_spec(top) is None

    def stub(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod

    def unavailable(*_a, **_k):
        raise RuntimeError("not available in the Mimi oracle (package not installed)")
    if missing("huggingface_hub"):
        stub("huggingface_hub", hf_hub_download=unavailable)
        stub("huggingface_hub.errors", EntryNotFoundError=type("EntryNotFoundError", (Exception,), {}))
    if missing("sentencepiece"):
        stub("sentencepiece", SentencePieceProcessor=type("SentencePieceProcessor", (), {}))
    if missing("safetensors"):
        stub("safetensors")
        stub("safetensors.torch", load_file=unavailable, save_file=unavailable)


def peer_available() -> bool:
    return importlib.util.find_spec("moshi") is not None and importlib.util.find_spec("einops") is not None


def peer_mimi(cfg: MimiConfig, state: Dict[str, torch.Tensor], device="cpu", num_codebooks: int = 8):
    """moshi's ``get_mimi(None, config)`` with our moshi-layout decoder weights loaded (strict)."""
    _stub_unused_imports()
    from moshi.models import loaders
    mimi = loaders.get_mimi(None, cfg.moshi_kwargs(), device=device, num_codebooks=num_codebooks)
    full = mimi.state_dict()
    unknown = set(state) - set(full)
    if unknown:
        raise KeyError(f"keys not in moshi's Mimi: {sorted(unknown)[:4]}")
    full.update({k: v.to(device) for k, v in state.items()})
    mimi.load_state_dict(full, strict=True)
    return mimi.eval()


def peer_context(graphs: bool = True, compiled: bool = True):
    """moshi's switches: per-frame CUDA graphs on/off, ``torch.compile`` of RoPE on/off."""
    import moshi.utils.compile as mc
    mc._disable_cuda_graph = not graphs
    return nullcontext() if compiled else mc.no_compile()


@torch.no_grad()
def peer_stream(mimi, codes: torch.Tensor, cfg: MimiConfig, graphs=True, compiled=True, sync=False):
    """moshi's streaming decode, one frame per call. Returns (audio [1,1,N*fs], seconds' wall times)."""
    times, out = [], []
    with peer_context(graphs, compiled), mimi.streaming(1):
        for k, (lo, hi) in enumerate(_seconds(cfg, codes.shape[1])):
            _sync(sync)
            t0 = time.perf_counter()
            for t in range(lo, hi):
                out.append(mimi.decode(codes[None, :, t:t + 1]).clone())
            _sync(sync)
            times.append(time.perf_counter() - t0)
    return torch.cat(out, dim=-1), times


# -- ours -----------------------------------------------------------------------------------------------
#: execution-order variants, all with graph replay: the model flags each sets (the others off)
VARIANTS = {"graphs, frame-major": {},
            "graphs, layer-major": {"layer_major": True},
            "graphs, +batched attention": {"layer_major": True, "batch_attention": True},
            "graphs, +batched conv": {"layer_major": True, "batch_conv": True},
            "graphs, +batched conv-tr": {"layer_major": True, "batch_conv_tr": True},
            "graphs, +strided matmul": {"layer_major": True, "batch_matmul_strided": True},
            "graphs, +batched matmul": {"layer_major": True, "batch_matmul": True}}
FLAGS = ("layer_major", "batch_attention", "batch_conv", "batch_conv_tr", "batch_matmul_strided", "batch_matmul")


def set_variant(model: MimiDecoder, flags: Optional[Dict[str, bool]] = None) -> None:
    """Set the order explicitly (``flags`` on, the others off); None: the order the self-check chose."""
    for f in FLAGS:
        setattr(model, f, None if flags is None else bool(flags.get(f, False)))


@torch.no_grad()
def ours_stream(model: MimiDecoder, codes: torch.Tensor, mode: str, sync=False, debug=False):
    """Our decode, one engine step per second. Returns (audio, seconds' wall times, executor)."""
    from engine.core import make_plan
    cfg = model.cfg
    plan = make_plan(model.regions(), model.spec())
    ex = Executor(model, plan, codes.device, **Toggles.from_mode(mode), debug=debug)
    ex.prepare_graphs(lambda sp: model.example_inputs(sp, codes.device, codes.shape[0]))
    ex.init_state()
    times, out = [], []
    for lo, hi in _seconds(cfg, codes.shape[1]):
        _sync(sync)
        t0 = time.perf_counter()
        out.append(ex.step({"codes": codes[:, lo:hi]})["audio"])
        _sync(sync)
        times.append(time.perf_counter() - t0)
    return torch.cat(out, dim=-1), times, ex


def _seconds(cfg: MimiConfig, frames: int):
    k = 0
    while cfg.frames_before(k + 1) <= frames:
        yield cfg.frames_before(k), cfg.frames_before(k + 1)
        k += 1


def _sync(on: bool) -> None:
    if on and torch.cuda.is_available():
        torch.cuda.synchronize()


# -- measurement ---------------------------------------------------------------------------------------
def _per_second_ms(times: List[float], cfg: MimiConfig, skip: int) -> List[float]:
    """ms per audio second (each second's wall time over its audio length), after ``skip`` warm-up seconds."""
    return [1e3 * t / ((cfg.frames_before(k + 1) - cfg.frames_before(k)) / cfg.frame_rate)
            for k, t in enumerate(times) if k >= skip]


def _summary(per: List[float]) -> Dict[str, float]:
    per = sorted(per)
    return {"median_ms": percentile(per, 50), "p90_ms": percentile(per, 90), "seconds_timed": len(per)}


def _stats(times: List[float], cfg: MimiConfig, skip: int) -> Dict[str, float]:
    return _summary(_per_second_ms(times, cfg, skip))


def _kernels(fn, audio_seconds: float) -> Dict[str, float]:
    """CUDA kernels and their summed device time per audio second (:func:`engine.bench.accounting.profiled`),
    and per 80 ms frame."""
    _, counts = accounting.profiled(fn, cuda=True)
    out = accounting.per_audio_second(counts, audio_seconds, most=6)
    out["kernels_per_frame"] = out["kernels_per_audio_s"] / 12.5
    return out


def _memory(fn, cuda: bool):
    if not cuda:
        return fn(), {}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    res = fn()
    torch.cuda.synchronize()
    return res, {"peak_alloc_above_weights_mib": (torch.cuda.max_memory_allocated() - base) / 2 ** 20,
                 "max_reserved_mib": torch.cuda.max_memory_reserved() / 2 ** 20}


def _equal(a: torch.Tensor, b: torch.Tensor) -> Dict[str, object]:
    """Whole outputs compared: equal only with the same shape and every sample the same. Outputs of different
    lengths are not equal (no part of them is compared): ``shapes`` says so and ``max_abs_diff`` is None."""
    if a.shape != b.shape:
        return {"equal": False, "max_abs_diff": None, "shapes": [list(a.shape), list(b.shape)]}
    return {"equal": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max()) if a.numel() else 0.0}


def _verdict(v: Dict[str, object]) -> str:
    """A comparison for the table: yes, or no and why (the largest difference, or the two shapes)."""
    if v["equal"]:
        return "yes"
    if v["max_abs_diff"] is None:
        a, b = v["shapes"]
        return f"no (shape {tuple(a)} vs {tuple(b)})"
    return f"no (max {v['max_abs_diff']:.2e})"


def run(cfg: MimiConfig, seconds: int, k: int, seed: int, warmup: int, profile_seconds: int,
        device: str = "cuda", dump=lambda res: None, quiet: bool = False, repeats: int = 1) -> Dict:
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    tf32_off()
    torch.backends.cudnn.benchmark = False
    state = W.random_state(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    frames = cfg.frames_before(seconds)
    codes = torch.randint(0, cfg.bins, (k, frames), generator=g).to(dev)
    res: Dict = {"config": {"size_dims": f"d{cfg.dimension} x{cfg.num_layers} ctx{cfg.context}", "codebooks": k,
                            "seconds": seconds, "frames": frames, "warmup_seconds": warmup, "repeats": repeats,
                            "torch": torch.__version__,
                            "device": torch.cuda.get_device_name() if cuda else "cpu"},
                 "modes": {}}
    mem = torch.cuda.memory_allocated if cuda else (lambda: 0)
    base0 = mem()
    mimi = peer_mimi(cfg, state, dev, k)
    res["config"]["moshi_weights_mib"] = (mem() - base0) / 2 ** 20
    base1 = mem()
    ours = MimiDecoder(cfg).to(dev).load_moshi_state(state)
    res["config"]["ours_weights_mib"] = (mem() - base1) / 2 ** 20
    _sync(cuda)
    t0 = time.perf_counter()
    verdicts = choose(ours, dev, k)
    _sync(cuda)
    res["config"]["self_check_s"] = round(time.perf_counter() - t0, 3)
    res["config"]["fast_paths"] = [v.line() for v in verdicts]
    res["config"]["chosen_order"] = chosen_order(ours)
    runs = [("moshi graphs, RoPE eager", lambda: peer_stream(mimi, codes, cfg, graphs=True, compiled=False, sync=True))]
    runs += [(f"ours {'stock-like' if m == 'stock' else m}", (lambda m=m: ours_stream(ours, codes, m, sync=True)[:2]))
             for m in MODES]
    runs += [(f"ours {v}", (lambda v=v: _variant(ours, VARIANTS[v], lambda: ours_stream(ours, codes, "graphs",
                                                                                       sync=True)[:2])))
             for v in VARIANTS if cuda]
    runs += [("moshi eager", lambda: peer_stream(mimi, codes, cfg, graphs=False, compiled=True, sync=True)),
             ("moshi graphs", lambda: peer_stream(mimi, codes, cfg, graphs=True, compiled=True, sync=True))]
    _rounds(res, runs, repeats, cfg, warmup, cuda, dump, quiet)
    _profile(res, mimi, ours, cfg, codes, profile_seconds if cuda else 0)
    return res


def _rounds(res: Dict, runs, repeats: int, cfg: MimiConfig, warmup: int, cuda: bool, dump, quiet: bool) -> None:
    """Every run once per round, ``repeats`` rounds (interleaved: drift hits every mode alike). A mode's
    median / p90 are over all its timed seconds of all rounds; ``round_medians_ms`` lists each round's;
    its audio of every round must equal its first round's (``repeats_identical``)."""
    audio: Dict[str, torch.Tensor] = {}
    times: Dict[str, List[float]] = {}
    rounds: Dict[str, List[float]] = {}
    with progress(len(runs) * repeats, desc="decoders", unit="run", quiet=quiet) as bar:
        for r in range(repeats):
            for name, fn in runs:
                bar.set_postfix_str(f"{name} (round {r + 1})")
                if "error" in res["modes"].get(name, {}):
                    bar.update()
                    continue
                try:
                    (wav, t), used = _memory(fn, cuda)
                except Exception as e:                     # e.g. torch.compile unavailable on this machine
                    res["modes"][name] = {"error": f"{type(e).__name__}: {e}"[:400]}
                    bar.update()
                    continue
                times.setdefault(name, []).extend(_per_second_ms(t, cfg, warmup))
                rounds.setdefault(name, []).append(_stats(t, cfg, warmup)["median_ms"])
                same = bool(torch.equal(audio.setdefault(name, wav), wav))
                prev = res["modes"].get(name, {})
                res["modes"][name] = {**_summary(times[name]), **used,
                                      "round_medians_ms": rounds[name],
                                      "repeats_identical": prev.get("repeats_identical", True) and same}
                _compare(res, audio)
                dump(res)
                bar.update()
    head = res["modes"].get("moshi graphs", {})
    for m in res["modes"].values():
        if "median_ms" in m and "median_ms" in head:
            m["moshi_graphs_over_this"] = head["median_ms"] / m["median_ms"]


def chosen_order(model: MimiDecoder) -> str:
    """The order the self-check left the model in, in words."""
    if not model.chosen.get("layer_major"):
        return "frame-major (the reference)"
    extra = [name for flag, name in (("batch_attention", "batched attention"), ("batch_conv", "batched convs"),
                                     ("batch_conv_tr", "batched transposed convs"),
                                     ("batch_matmul_strided", "strided-batched matmuls"),
                                     ("batch_matmul", "batched matmuls")) if model.chosen.get(flag)]
    return "layer-major" + ("".join(f" + {e}" for e in extra))


def _variant(model: MimiDecoder, variant, fn):
    set_variant(model, variant)
    try:
        return fn()
    finally:
        set_variant(model)


def _compare(res: Dict, audio: Dict[str, torch.Tensor]) -> None:
    ref = audio.get("moshi graphs, RoPE eager")
    for name, wav in audio.items():
        if ref is not None and name != "moshi graphs, RoPE eager":
            res["modes"][name]["vs_moshi_eager_rope"] = _equal(wav, ref)
        if "moshi graphs" in audio and name.startswith("ours"):
            res["modes"][name]["vs_moshi_compiled_rope"] = _equal(wav, audio["moshi graphs"])
        if "moshi graphs" in audio and name == "moshi eager":
            res["modes"][name]["vs_moshi_graphs"] = _equal(wav, audio["moshi graphs"])


def _profile(res, mimi, ours, cfg, codes, n_sec) -> None:
    part = codes[:, : cfg.frames_before(max(n_sec, 1))]
    _, _, ex = ours_stream(ours, part, "graphs")
    res["config"]["ours_state_bytes"] = ex.state_bytes()
    res["config"]["graphs_captured"] = ex.stats.captures
    if not n_sec:
        return
    secs = part.shape[1] / cfg.frame_rate
    jobs = {"moshi eager": lambda: peer_stream(mimi, part, cfg, graphs=False, compiled=True),
            "ours demand": lambda: ours_stream(ours, part, "demand")}
    for name, fn in jobs.items():
        if "error" in res["modes"].get(name, {}):
            continue
        fn()                                        # warm (compile, cuBLAS handles)
        res["modes"][name].update(_kernels(fn, secs))
    for name, variant in [("ours graphs", None)] + [(f"ours {v}", VARIANTS[v]) for v in VARIANTS]:
        if name in res["modes"] and "error" not in res["modes"][name]:
            replay = _variant(ours, variant, lambda: _graph_replayer(ours, part))   # captured before the profile
            res["modes"][name].update(_kernels(lambda: _variant(ours, variant, replay), secs))


def _graph_replayer(model: MimiDecoder, codes: torch.Tensor):
    """A function that replays one session's seconds over graphs captured beforehand."""
    from engine.core import make_plan
    plan = make_plan(model.regions(), model.spec())
    ex = Executor(model, plan, codes.device, demand_sized=True, graph_replay=True)
    ex.prepare_graphs(lambda sp: model.example_inputs(sp, codes.device, codes.shape[0]))
    ex.init_state()
    secs = list(_seconds(model.cfg, codes.shape[1]))

    @torch.no_grad()
    def replay():
        for lo, hi in secs:
            ex.step({"codes": codes[:, lo:hi]})
    return replay


def table(res: Dict, wrap: bool = True) -> str:
    """The results as an aligned markdown table (``wrap``: fits 120 columns)."""
    heads = ["mode", "ms / audio s (median)", "p90", "moshi graphs / this", "kernels / frame",
             "kernel ms / audio s", "peak alloc above weights MiB", "equal to moshi (RoPE eager)",
             "equal to moshi (compiled RoPE)"]
    body = []
    for name, m in res["modes"].items():
        if "error" in m:
            body.append([name, f"error: {m['error'][:80]}"] + [""] * 7)
            continue

        def eq(key):
            v = m.get(key)
            return "ref" if v is None and key == "vs_moshi_eager_rope" else ("" if v is None else _verdict(v))
        kpf = f"{m['kernels_per_frame']:.0f}" if "kernels_per_frame" in m else ""
        kms = f"{m['kernel_ms_per_audio_s']:.1f}" if "kernel_ms_per_audio_s" in m else ""
        peak = f"{m['peak_alloc_above_weights_mib']:.1f}" if "peak_alloc_above_weights_mib" in m else ""
        ratio = f"{m['moshi_graphs_over_this']:.2f}x" if "moshi_graphs_over_this" in m else ""
        same = "" if m.get("repeats_identical", True) else " (rounds differ!)"
        body.append([name + same, f"{m['median_ms']:.1f}", f"{m['p90_ms']:.1f}", ratio, kpf, kms, peak,
                     eq("vs_moshi_eager_rope"), eq("vs_moshi_compiled_rope")])
    return stats_table(body, heads, max_widths=[24, None, None, None, None, None, None, 12, 12], header_width=10,
                       wrap=wrap)


def main(argv=None) -> int:
    p = OneLineParser(prog="duplexcadence-bench mimi", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="released", choices=["released", "tiny"])
    p.add_argument("--seconds", type=int, default=24, help="audio seconds of codes to decode (>= warm-up + 1)")
    p.add_argument("--warmup", type=int, default=2, help="seconds left out of the statistics")
    p.add_argument("--num-codebooks", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile-seconds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="rounds of every mode, interleaved (medians over all)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a functional dry run (timings only, no kernels or memory)")
    p.add_argument("--json", default="bench-results/mimi.json",
                   help="results as JSON here (written as it goes); the markdown table (.md) and the plot (.png) "
                        "go next to it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("duplexcadence-bench mimi: needs a CUDA GPU (or --device cpu for a dry run)", file=sys.stderr)
        return 2
    if not peer_available():
        print("duplexcadence-bench mimi: needs moshi==0.2.13 and einops (pip install --no-deps moshi==0.2.13 einops)",
              file=sys.stderr)
        return 2
    if a.seconds <= a.warmup:
        p.error("--seconds must exceed --warmup")
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    command = "duplexcadence-bench mimi " + " ".join(sys.argv[1:] if argv is None else argv)

    dump = report.progressive_json(Path(a.json), "duplexcadence-bench mimi", command)   # partial results survive a timeout
    if dump is None:
        return 1
    res = run(preset(a.size), a.seconds, a.num_codebooks, a.seed, a.warmup, a.profile_seconds, a.device, dump,
              quiet=a.quiet, repeats=a.repeats)
    tab = table(res)
    print(tab)
    ok = {n: m for n, m in res["modes"].items() if "error" not in m}
    fig = report.Figure([report.Bars("ms per audio second", "ms", list(ok),
                                     {"median": [m["median_ms"] for m in ok.values()],
                                      "p90": [m["p90_ms"] for m in ok.values()]})])
    for line in res["config"].get("fast_paths", []):
        print(f"self-check: {line}")
    print(f"ours graphs runs: {res['config'].get('chosen_order')} (self-check {res['config'].get('self_check_s')} s)")
    md = report.markdown("Mimi decoder: moshi vs ours", command, [("", table(res, wrap=False))],
                         [f"{k}: {v}" for k, v in res["config"].items()])
    written = report.write_all(Path(a.json), res, md, fig)
    print("wrote " + ", ".join(str(x) for x in written), file=sys.stderr)
    return 0
