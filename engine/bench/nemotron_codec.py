"""`duplexcadence-bench nemotron-codec`: nemo's codec decode vs our modes, one run, same weights and codes.

Both sides decode the same seeded random codes (``--seconds`` of a session at 12.5 Hz) with the same
seeded random weights at the released size, fp32 with TF32 off (as nemo's ``disable_tf32``).

* nemo, per-frame cached: NVIDIA's serving loop, one ``RVQVAEModel.decode`` per frame through a
  ``CausalConv1dCache`` — as users run it (cuDNN's defaults) and with deterministic cuDNN (the bit
  reference: cuDNN's transposed convs may otherwise not repeat their own bits);
* nemo, window re-decode: ``duplex_ear_tts.py``'s loop, which after every frame decodes the last
  ``inference_codec_decoding_prev_tokens_number`` frames of history without a cache (default: all
  of it) and keeps the newest frame, over the whole session;
* ours: stock-like state, demand-sized state, graph replay (one graph per 12- or 13-frame second)
  with every library call per frame (the reference path), graph replay as users run it (the library
  calls the start-up self-check found bit-identical made once per second: ``fastpaths.choose``), and
  graph replay with every kind batched (an experiment: its bits are checked, not assumed).

Rounds interleave the modes; each audio second is timed as a block (sync, its frames, sync).
Reported: ms per audio second (median, p90), CUDA kernels and their summed GPU time per audio second
(profiler), peak memory above the weights, state bytes, and bit-identity (torch.equal) with nemo.
The JSON (``--json``) is written as the run goes; the markdown table (.md) and a PNG plot (.png) go next to it.
nemo's ``ear_tts_vae_codec.py`` is loaded by path (:mod:`.peer`); the product never imports it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from engine.cli.validate import OneLineParser
from engine.bench import accounting, report
from engine.bench.mathmode import tf32_off
from engine.core import Executor, make_plan
from engine.stats import percentile, progress
from engine.stats import table as stats_table

from engine.models.nemotron_codec import peer
from engine.models.nemotron_codec import weights as W
from engine.models.nemotron_codec.config import CodecConfig, preset
from engine.models.nemotron_codec.fastpaths import choose
from engine.models.nemotron_codec.model import NemotronCodecDecoder

CHECKED = "ours graphs, self-checked batched calls (as users run it)"
OURS = {"ours stock": (False, False, False), "ours demand": (True, False, False),
        "ours graphs": (True, True, False), CHECKED: (True, True, None),
        "ours graphs, batched calls (experiment)": (True, True, True)}
#: graph replay with one kind of library call made once per second (which kinds keep nemo's bits)
BATCH_KINDS = {f"ours graphs, batched {k} only (experiment)": (True, True, frozenset({k}))
               for k in ("pwconv", "head", "dwconv", "convtr", "mean", "fft")}
REF = "nemo per-frame cached (deterministic cuDNN)"
AS_RUN = "nemo per-frame cached (as users run it)"
WINDOW = "nemo window re-decode"


def seconds_of(cfg: CodecConfig, frames: int) -> List[Tuple[int, int]]:
    pattern, out, lo, k = cfg.seconds_pattern(), [], 0, 0
    while lo + pattern[k % len(pattern)] <= frames:
        out.append((lo, lo + pattern[k % len(pattern)]))
        lo, k = lo + pattern[k % len(pattern)], k + 1
    return out


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _deterministic(on: bool) -> None:
    torch.backends.cudnn.deterministic = on


# -- the sides ------------------------------------------------------------------------------------------
@torch.no_grad()
def nemo_cached(codec, codes: torch.Tensor, secs, dev, deterministic: bool):
    """One frame per call through a CausalConv1dCache. Returns (audio [N * ratio], per-second seconds)."""
    _deterministic(deterministic)
    cache, out, times = peer.module().CausalConv1dCache(), [], []
    frames = codes.t()[None]                                                      # [1, N, K]
    for lo, hi in secs:
        _sync(dev)
        t0 = time.perf_counter()
        for t in range(lo, hi):
            wav, _ = codec.decode(frames[:, t:t + 1], cache=cache)
            out.append(wav.reshape(-1))
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return torch.cat(out), times


@torch.no_grad()
def nemo_window(codec, codes: torch.Tensor, secs, dev, window=None, budget_s: float = float("inf")):
    """duplex_ear_tts.py's incremental loop: re-decode the history window after every frame (stops
    after the second in which ``budget_s`` of wall time ran out: the whole history grows as O(T^2))."""
    _deterministic(False)
    ratio, hist, out, times = codec.config.wav_to_token_ratio, codes.t()[None], [], []
    start = time.perf_counter()
    for lo, hi in secs:
        if time.perf_counter() - start > budget_s:
            break
        _sync(dev)
        t0 = time.perf_counter()
        for t in range(lo, hi):
            first = 0 if window is None else max(0, t + 1 - window)
            wav, _ = codec.decode(hist[:, first:t + 1], torch.tensor([t + 1 - first], device=dev))
            out.append(wav.reshape(-1)[-ratio:])
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return torch.cat(out), times


def ours_executor(model: NemotronCodecDecoder, dev, demand: bool, graphs: bool) -> Executor:
    ex = Executor(model, make_plan(model.regions(), model.spec()), dev, demand_sized=demand, graph_replay=graphs)
    ex.prepare_graphs(lambda sp: model.example_inputs(sp, dev))
    ex.init_state()
    return ex


@torch.no_grad()
def ours(model: NemotronCodecDecoder, codes: torch.Tensor, secs, dev, demand, graphs, batched):
    """``batched``: the kinds made once per second (None: what the start-up self-check chooses)."""
    _deterministic(True)
    model.batched = batched
    if batched is None:
        choose(model, dev)                                  # cached after the first call
    try:
        ex = ours_executor(model, dev, demand, graphs)
        out, times = [], []
        for lo, hi in secs:
            _sync(dev)
            t0 = time.perf_counter()
            out.append(ex.step({"codes": codes[:, lo:hi]})["audio"].reshape(-1))
            _sync(dev)
            times.append(time.perf_counter() - t0)
        return torch.cat(out), times, ex
    finally:
        model.batched = False


# -- measurement -----------------------------------------------------------------------------------------
def per_audio_second(times: List[float], secs, rate: float, skip: int) -> List[float]:
    return [1e3 * t / ((hi - lo) / rate) for k, (t, (lo, hi)) in enumerate(zip(times, secs)) if k >= skip]


def summary(ms: List[float]) -> Dict[str, float]:
    """Median, p90 (the product's one percentile: linear between ranks) and worst of ms per audio second."""
    return {"median_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90), "max_ms": max(ms, default=0.0),
            "seconds_timed": len(ms)}


def kernels(fn: Callable[[], object], audio_seconds: float) -> Dict[str, object]:
    """CUDA kernels and their summed GPU time per audio second (:func:`engine.bench.accounting.profiled`)."""
    _, counts = accounting.profiled(fn, cuda=True)
    return accounting.per_audio_second(counts, audio_seconds, most=5)


def equal(a: torch.Tensor, b: torch.Tensor) -> Dict[str, object]:
    n = min(a.numel(), b.numel())
    d = (a[:n] - b[:n]).abs()
    return {"equal": bool(a.numel() == b.numel() and torch.equal(a, b)), "max_abs_diff": float(d.max())}


def run(cfg: CodecConfig, seconds: int, seed: int, rounds: int, warmup: int, window_seconds: int,
        profile_seconds: int, device: str, dump=lambda res: None, window_budget_s: float = 30.0,
        each_kind: bool = False, quiet: bool = False) -> Dict:
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    tf32_off()
    torch.backends.cudnn.benchmark = False
    state = W.random_state(cfg, seed)
    secs = seconds_of(cfg, int(seconds * cfg.frame_rate))
    frames = secs[-1][1]
    codes = torch.randint(0, cfg.codebook_size, (cfg.num_quantizers, frames),
                          generator=torch.Generator().manual_seed(seed + 1)).to(dev)
    mem = torch.cuda.memory_allocated if cuda else (lambda: 0)
    base = mem()
    codec = peer.build(cfg, state, dev)
    nemo_mib = (mem() - base) / 2 ** 20
    base = mem()
    model = NemotronCodecDecoder(cfg)
    W.load_into(model, W.check_state(state, cfg, f"random seed {seed}"))
    model = model.to(dev)
    res = {"config": {"codec": f"base {cfg.base_hidden_size}, rates {list(cfg.stage_rates())}, "
                               f"{cfg.num_quantizers} x {cfg.codebook_size}, {cfg.sample_rate} Hz",
                      "seconds": len(secs), "frames": frames, "rounds": rounds, "warmup_seconds": warmup,
                      "torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
                      "nemo_weights_mib": nemo_mib, "ours_weights_mib": (mem() - base) / 2 ** 20},
           "modes": {}}
    model.batched = None
    _deterministic(True)                                    # as the tail holds cuDNN for its streams
    res["config"]["fast_paths"] = [v.line() for v in choose(model, dev)]
    res["config"]["batched_by_self_check"] = sorted(model.chosen)
    jobs: Dict[str, Callable[[], Tuple[torch.Tensor, List[float]]]] = {
        AS_RUN: lambda: nemo_cached(codec, codes, secs, dev, False),
        REF: lambda: nemo_cached(codec, codes, secs, dev, True)}
    for name, (demand, graphs, batched) in {**OURS, **(BATCH_KINDS if each_kind else {})}.items():
        if graphs and not cuda:
            continue                                  # no row says "graphs" where graph replay cannot run
        jobs[name] = (lambda d=demand, g=graphs, b=batched: ours(model, codes, secs, dev, d, g, b)[:2])
    audio, times = {}, {name: [] for name in jobs}
    windows = 1 + int(window_seconds > 0)
    with progress(rounds * len(jobs) + windows + 1, desc="decodes (modes interleaved)", unit="run",
                  quiet=quiet) as bar:
        _rounds(res, jobs, rounds, audio, times, secs, cfg, warmup, cuda, mem, dump, bar)
        for name, wav in audio.items():              # the first round's audio of each mode
            if name != REF:
                res["modes"][name]["vs_nemo"] = equal(wav, audio[REF])
        _window(res, codec, codes, secs, dev, cfg, window_seconds, audio[REF], warmup, window_budget_s, bar)
        dump(res)
        bar.set_postfix_str("state and kernel profile")
        _state_and_profile(res, model, codec, codes, secs, dev, cfg, profile_seconds if cuda else 0)
        bar.update()
    _targets(res)
    dump(res)
    return res


def _rounds(res, jobs, rounds, audio, times, secs, cfg, warmup, cuda, mem, dump, bar) -> None:
    """``rounds`` interleaved passes over every per-frame / per-second mode (timings pooled over rounds)."""
    for r in range(rounds):
        for name, fn in jobs.items():
            bar.set_postfix_str(f"round {r + 1}: {name}")
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            before = mem()
            wav, t = fn()
            times[name] += per_audio_second(t, secs, cfg.frame_rate, warmup)
            audio.setdefault(name, wav)
            m = res["modes"].setdefault(name, {})
            if cuda:
                m["peak_above_start_mib"] = max(m.get("peak_above_start_mib", 0.0),
                                                (torch.cuda.max_memory_allocated() - before) / 2 ** 20)
                m["max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2 ** 20
            m.update(summary(times[name]))
            if name != REF and REF in audio:
                m["vs_nemo"] = equal(audio[name], audio[REF])
            dump(res)
            bar.update()


def _window(res, codec, codes, secs, dev, cfg, window_seconds, ref, warmup, budget_s, bar) -> None:
    windows = [("whole history", None)] + ([(f"{window_seconds} s window", int(window_seconds * cfg.frame_rate))]
                                           if window_seconds > 0 else [])
    for label, window in windows:
        bar.set_postfix_str(f"nemo window re-decode ({label})")
        t0 = time.perf_counter()
        wav, t = nemo_window(codec, codes, secs, dev, window, budget_s)
        ms = per_audio_second(t, secs, cfg.frame_rate, min(warmup, len(t) - 1))
        res["modes"][f"{WINDOW} ({label})"] = {
            **summary(ms), "last_second_ms": ms[-1], "seconds_reached": len(t), "session_seconds": len(secs),
            "wall_s": time.perf_counter() - t0, "vs_nemo": equal(wav, ref[:wav.numel()])}
        bar.update()


def _state_and_profile(res, model, codec, codes, secs, dev, cfg, n_sec) -> None:
    ex = ours_executor(model, dev, True, dev.type == "cuda")
    res["config"]["ours_state_bytes"] = ex.state_bytes()
    res["config"]["graphs_captured"] = ex.stats.captures
    res["config"]["shape_signatures"] = len(ex.plan.signatures)
    if not n_sec:
        return
    part = secs[:n_sec]
    audio_s = part[-1][1] / cfg.frame_rate
    sub = codes[:, :part[-1][1]]
    jobs = {AS_RUN: lambda: nemo_cached(codec, sub, part, dev, False),
            REF: lambda: nemo_cached(codec, sub, part, dev, True),
            "ours stock": lambda: ours(model, sub, part, dev, False, False, False),
            "ours demand": lambda: ours(model, sub, part, dev, True, False, False)}
    for name, fn in jobs.items():
        fn()
        res["modes"][name].update(kernels(fn, audio_s))
    for name, batched in (("ours graphs", False), (CHECKED, None), ("ours graphs, batched calls (experiment)", True)):
        model.batched = batched
        _deterministic(True)
        if batched is None:
            choose(model, dev)
        try:
            ex = ours_executor(model, dev, True, True)                      # captured before the profile
            res["modes"][name].update(kernels(lambda: [ex.step({"codes": sub[:, lo:hi]}) for lo, hi in part],
                                              audio_s))
        finally:
            model.batched = False


def _targets(res: Dict) -> None:
    m = res["modes"]
    g, nemo = m.get(CHECKED, {}), m.get(AS_RUN, {})
    if "median_ms" in g and "median_ms" in nemo:
        res["targets"] = {"speedup_vs_nemo_per_frame_cached": nemo["median_ms"] / g["median_ms"],
                          "target_speedup": 5.0}
        if "kernel_ms_per_audio_s" in g:
            res["targets"]["replay_over_kernel_time"] = g["median_ms"] / g["kernel_ms_per_audio_s"]
            res["targets"]["target_replay_over_kernel_time"] = 1.2


def table(res: Dict, wrap: bool = True) -> str:
    """The results as an aligned markdown table (``wrap``: fits 120 columns; ``False``: one line per row)."""
    heads = ["mode", "ms / audio s (median)", "p90", "kernels / audio s", "GPU kernel ms / audio s",
             "peak MiB above start", "equal to nemo (deterministic cuDNN)"]
    body = []
    for name, m in res["modes"].items():
        eq = m.get("vs_nemo")
        same = "reference" if name == REF else ("" if eq is None else
                                                 ("yes" if eq["equal"] else f"no (max {eq['max_abs_diff']:.2e})"))
        cells = [f"{m[k]:.1f}" if k in m else "" for k in
                 ("median_ms", "p90_ms", "kernels_per_audio_s", "kernel_ms_per_audio_s", "peak_above_start_mib")]
        body.append([name] + cells + [same])
    return stats_table(body, heads, max_widths=[28, None, None, None, None, None, 17],
                       header_width=[None, 12, None, 10, 12, 10, 16], wrap=wrap)


def figure(res: Dict) -> report.Figure:
    """Median and p90 ms per audio second: the per-frame / per-second modes, then nemo's window re-decodes
    (on their own axis: the whole history grows as O(T^2)); GPU kernel time per audio second where profiled."""
    modes = res["modes"]
    panels: List[object] = []
    for title, names in (("ms per audio second", [n for n in modes if not n.startswith(WINDOW)]),
                         ("nemo window re-decode: ms per audio second", [n for n in modes if n.startswith(WINDOW)])):
        if names:
            p90 = [modes[n]["p90_ms"] for n in names]
            labels = [n[len(WINDOW):].strip(" ()") if n.startswith(WINDOW) else n for n in names]
            panels.append(report.Bars(title, "ms", labels,
                                      {"median": [modes[n]["median_ms"] for n in names], "p90": p90},
                                      hline=(1000.0, "real time") if max(p90) > 700 else None))
    prof = {n: m["kernel_ms_per_audio_s"] for n, m in modes.items() if "kernel_ms_per_audio_s" in m}
    if prof:
        panels.append(report.Bars("GPU kernel time per audio second (profiled)", "ms", list(prof),
                                  {"kernel ms": list(prof.values())}))
    return report.Figure(panels)


def notes(res: Dict) -> List[str]:
    t: Optional[Dict] = res.get("targets")
    out = [f"{k}: {v}" for k, v in res["config"].items()]
    if t:
        out.insert(0, f"ours (graphs, self-checked batched calls) vs nemo per-frame cached, both as users run them: "
                      f"{t['speedup_vs_nemo_per_frame_cached']:.2f}x (target {t['target_speedup']:.0f}x)")
    out.append("Rounds interleave the modes; each audio second is timed as a block (sync, its frames, sync); "
               "the first warm-up seconds of each round are left out. Bits: torch.equal to nemo per-frame cached "
               "with deterministic cuDNN (nemo's default cuDNN may not repeat its own bits).")
    return out


def main(argv=None) -> int:
    p = OneLineParser(prog="duplexcadence-bench nemotron-codec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="released", choices=["released", "tiny"])
    p.add_argument("--seconds", type=int, default=60, help="session length (audio seconds of codes)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every per-frame / per-second mode")
    p.add_argument("--warmup", type=int, default=2, help="seconds of each round left out of the statistics")
    p.add_argument("--window-seconds", type=int, default=2, help="also re-decode a window this long (0: only the "
                                                                 "whole history, nemo's default)")
    p.add_argument("--window-budget-s", type=float, default=30.0,
                   help="wall time after which each window re-decode stops (the whole history costs O(T^2))")
    p.add_argument("--profile-seconds", type=int, default=2)
    p.add_argument("--each-batched-kind", action="store_true",
                   help="also time graph replay with each kind of library call batched alone (which keep the bits)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", default="bench-results/nemotron-codec.json",
                   help="results as JSON here (written as it goes); the markdown table (.md) and the plot (.png) "
                        "go next to it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    if not peer.available():
        print("duplexcadence-bench nemotron-codec: nemo's ear_tts_vae_codec.py (test oracle) and omegaconf are "
              "needed: pip install --no-deps -r tests/oracle-requirements.txt", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("duplexcadence-bench nemotron-codec: no CUDA device (use --device cpu)", file=sys.stderr)
        return 2
    if a.seconds < a.warmup + 1:
        print("duplexcadence-bench nemotron-codec: --seconds must exceed --warmup", file=sys.stderr)
        return 2

    command = report.command_line("duplexcadence-bench nemotron-codec", sys.argv[1:] if argv is None else argv)

    dump = report.progressive_json(Path(a.json), "duplexcadence-bench nemotron-codec", command)   # partial results survive a timeout
    if dump is None:
        return 1
    res = run(preset(a.size), a.seconds, a.seed, a.rounds, a.warmup, a.window_seconds, a.profile_seconds,
              a.device, dump, a.window_budget_s, a.each_batched_kind, a.quiet)
    print(table(res))
    print(json.dumps({"config": res["config"], "targets": res.get("targets")}, indent=1))
    md = report.markdown("Nemotron codec decoder: nemo vs ours", command, [("", table(res, wrap=False))], notes(res))
    try:
        written = report.write_all(Path(a.json), res, md, figure(res))
    except OSError as e:
        print(f"duplexcadence-bench nemotron-codec: error: {e}", file=sys.stderr)
        return 1
    print("wrote " + ", ".join(str(x) for x in written), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
