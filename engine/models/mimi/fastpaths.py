"""Mimi's faster execution orders, each enabled only where the engine's start-up self-check keeps the bits.

The reference is the frame-major order: each frame runs every layer before the next frame starts,
with moshi's shapes at every library call (the oracle tests prove it equals moshi's streaming
decode bit for bit). The faster orders (``second.py``) do the same arithmetic in fewer kernels:

* ``layer-major order`` — every layer over the whole second: elementwise and row-wise kernels
  (norms, RoPE, GELU/ELU, scales, overlap-adds) once per second, matmuls and convs still per
  frame. Exact where those kernels do not depend on the row count (CUDA; not the CPU's ELU, whose
  vectorized and scalar paths differ, so the CPU keeps frame-major order and is not checked unless
  asked: with that activation made layout-independent, the CPU keeps every bit too, see the tests).
* ``batched attention`` — one attention call per layer and second whose batch is the frames, each
  frame over the ring as it stood after its own write (``second.attention_batched``; needs a ring
  of at least a second's steps);
* ``batched convs`` — one cuDNN call per second for the non-transposed convs (on top of layer-major).
* ``batched transposed convs`` — the upsample's and the SEANet's transposed convs as one call per
  second whose batch is the second's frames.
* ``strided-batched matmuls`` — the transformer's projections and MLP as one strided-batched GEMM per
  second whose batch is the frames (each item at moshi's shape);
* ``batched matmuls`` — one GEMM per second over all the second's rows (taken only where the
  strided-batched ones are not: both replace the same per-frame calls).

Whether cuDNN / cuBLAS pick a kernel that sums in the same order for 12-13 frames at once as for
one is up to their heuristics on this GPU: :func:`choose` runs each order against the reference
on two seconds of fresh random codes (12 and 13 frames, both step shapes, state carried from the
first to the second) with the model's own weights, compares the audio and every state region with
``torch.equal`` (:func:`engine.fastpath.self_check`), and sets the model to the fastest order that
passed. On CUDA each trial runs both ways production runs a second: eager steps, and graphs captured
once and replayed (the executor's graph replay); on the CPU eagerly. A flag the caller set explicitly
on :class:`~engine.models.mimi.model.MimiDecoder` (True or False) is kept as given and reported as such.

Those verdicts hold for 12- and 13-frame steps. A short last second (``flush``: 1 to 12 frames, run
eagerly) is another shape: the model asks :func:`choose`'s shape check the first time it meets a frame
count (:meth:`~engine.models.mimi.model.MimiDecoder.chosen_for`), which tries the chosen order, then
layer-major order alone, on a whole second followed by a short one of that count, and runs the first
that keeps the bits, else the reference order. Each such verdict is its own (path, frame count) check.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch

from engine import fastpath
from engine.core import Executor, make_plan
from engine.fastpath import Verdict

from .model import MimiDecoder

#: the model flag each faster path sets, in the order they are checked
FLAGS: Dict[str, str] = {"layer-major order": "layer_major", "batched attention": "batch_attention",
                         "batched convs": "batch_conv", "batched transposed convs": "batch_conv_tr",
                         "strided-batched matmuls": "batch_matmul_strided", "batched matmuls": "batch_matmul"}
#: the order every faster path builds on (the batched calls only exist in layer-major order)
BASE = "layer-major order"
#: seconds decoded by one trial (12 + 13 frames at 12.5 Hz: both step shapes)
TRIAL_SECONDS = 2
TRIAL_SEED = 20261130


@contextmanager
def flags(model: MimiDecoder, **values: Optional[bool]) -> Iterator[MimiDecoder]:
    """The model with the given order flags (:data:`FLAGS`' values) set, restored afterwards."""
    old = {k: getattr(model, k) for k in values}
    try:
        for k, v in values.items():
            setattr(model, k, v)
        yield model
    finally:
        for k, v in old.items():
            setattr(model, k, v)


def trial_codes(model: MimiDecoder, num_codebooks: int, device) -> torch.Tensor:
    """Random codes [K, frames] for :data:`TRIAL_SECONDS` seconds (seeded: every check sees the same)."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(TRIAL_SEED)
    return torch.randint(0, cfg.bins, (num_codebooks, cfg.frames_before(TRIAL_SECONDS)), generator=g).to(device)


@torch.no_grad()
def decode_trial(model: MimiDecoder, codes: torch.Tensor, frames: Optional[Sequence[int]] = None,
                 graphs: bool = False, **order: bool) -> Dict[str, torch.Tensor]:
    """A fresh stream (demand arena) over ``codes`` [K, frames] in the given order: the audio [1, 1, N] of
    every step and every state region after the last one. ``frames``: the frames of each step (the last
    may be a short second, as ``flush`` runs it); None: every whole second in ``codes``. ``graphs``: the
    steps replay graphs captured ahead (as a live stream with graph replay on), else they run eagerly.
    The trial runs on a shallow copy of the model (same weights) with the order's flags set, so streams
    running on the model meanwhile see none of them."""
    cfg = model.cfg
    trial = copy.copy(model)
    for flag, on in order.items():
        setattr(trial, flag, on)
    if frames is None:
        frames = []
        while cfg.frames_before(len(frames) + 1) <= codes.shape[1]:
            frames.append(cfg.frames_before(len(frames) + 1) - cfg.frames_before(len(frames)))
    short = frames[-1] != cfg.frames_before(len(frames)) - cfg.frames_before(len(frames) - 1)
    spec = trial.spec(steps=len(frames), last_frames=frames[-1]) if short else trial.spec()
    ex = Executor(trial, make_plan(trial.regions(spec), spec), codes.device, demand_sized=True,
                  graph_replay=graphs)
    if graphs:
        ex.prepare_graphs(lambda sp: trial.example_inputs(sp, codes.device, codes.shape[0]))
    ex.init_state()
    out, lo = [], 0
    for n in frames:
        out.append(ex.step({"codes": codes[:, lo:lo + n]})["audio"])
        lo += n
    return {"audio": torch.cat(out, dim=-1), "state": ex.arena.export()}


def production_trial(model: MimiDecoder, codes: torch.Tensor, modes: Sequence[str],
                     frames: Optional[Sequence[int]] = None, **order: bool) -> Dict[str, Dict[str, torch.Tensor]]:
    """:func:`decode_trial` in each of ``modes`` (:func:`engine.fastpath.production_modes`)."""
    out = {}
    for mode in modes:
        extra = {} if frames is None else {"frames": frames}
        if mode == "graph":
            extra["graphs"] = True
        out[mode] = decode_trial(model, codes, **extra, **order)
    return out


#: the reference order: frame-major, every library call at moshi's shapes
REFERENCE: Dict[str, bool] = {flag: False for flag in FLAGS.values()}


def _candidate(path: str) -> Dict[str, bool]:
    """Layer-major order with ``path``'s flag on, every other one off."""
    return {**REFERENCE, "layer_major": True, FLAGS[path]: True}


def choose(model: MimiDecoder, device, num_codebooks: int = 8, check_cpu: bool = False) -> List[Verdict]:
    """Check Mimi's faster orders here and set the model's chosen flags; the verdicts, one per path.

    Runs before a stream captures its graphs (the trials run on a copy of the model with its own weights,
    eagerly and, on CUDA, in captured graphs, and leave nothing behind). Verdicts are cached per device,
    library versions, config and code, so a second stream of the same model checks nothing. Installs the
    check of a frame count first met (:func:`shape_check`). On the CPU the orders are not applicable (the trials
    cost seconds at the released size, and its ELU differs by layout) unless ``check_cpu``.
    """
    dev = torch.device(device)
    cfg = model.cfg
    codes = trial_codes(model, num_codebooks, dev)
    modes = fastpath.production_modes(dev)
    key = (cfg, cfg.seconds_pattern(), num_codebooks)          # the config, the shapes tried (frames, codebooks)
    reference: Dict[str, Dict[str, Dict[str, torch.Tensor]]] = {}     # decoded once, when a check first needs it

    def trial(candidate: Dict[str, bool]):
        def run(on: bool) -> Dict[str, Dict[str, torch.Tensor]]:
            if on:
                return production_trial(model, codes, modes, **candidate)
            if not reference:
                reference["out"] = production_trial(model, codes, modes, **REFERENCE)
            return reference["out"]
        return run

    chosen: Dict[str, bool] = {}
    verdicts: List[Verdict] = []
    not_here = None if dev.type == "cuda" or check_cpu else \
        "the CPU decodes frame by frame (its ELU's vectorized and scalar paths differ by layout)"
    for path, flag in FLAGS.items():
        given = getattr(model, flag)
        if given is not None:
            verdicts.append(Verdict(path, bool(given), "set explicitly by the caller"))
            chosen[flag] = bool(given)
            continue
        why = not_here
        if why is None and path != BASE and not chosen.get("layer_major"):
            why = f"it runs in {BASE}, which is off here"
        steps = max(cfg.seconds_pattern()) * cfg.upsample_stride
        if why is None and flag == "batch_attention" and cfg.context < steps:
            why = f"the ring ({cfg.context} steps) is shorter than a second ({steps} steps)"
        v = fastpath.self_check(f"mimi {path}", dev, key, trial(_candidate(path)), not_applicable=why)
        verdicts.append(_named(v, path))
        chosen[flag] = v.chosen
    verdicts += _combine(model, chosen, lambda path, flags: fastpath.self_check(
        f"mimi {path}", dev, key, trial(dict(REFERENCE, layer_major=True, **flags))))
    model.chosen = dict(chosen)
    model.chosen_at = {n: dict(chosen) for n in cfg.seconds_pattern()}
    model.check_frames = shape_check(model, dev, num_codebooks, chosen, verdicts)
    return verdicts


def shape_check(model: MimiDecoder, device: torch.device, num_codebooks: int, chosen: Dict[str, bool],
                verdicts: List[Verdict]) -> Callable[[int], Dict[str, bool]]:
    """The check of a frame count first met (a short last second), for :attr:`MimiDecoder.check_frames`:
    the whole seconds' ``chosen`` order, then layer-major order alone, each on a whole second followed by a
    second of ``n`` frames (eagerly, as ``flush`` runs it); the first that keeps every bit, else the reference
    order. Each check's verdict is appended to ``verdicts`` (the stream's list)."""
    cfg = model.cfg
    taken = {f: True for f, on in chosen.items() if on and getattr(model, f) is None}

    def check(n: int) -> Dict[str, bool]:
        if not taken:                                  # nothing the check chose: nothing to check
            return dict(chosen)
        first = cfg.seconds_pattern()[0]
        g = torch.Generator().manual_seed(TRIAL_SEED + n)
        codes = torch.randint(0, cfg.bins, (num_codebooks, first + n), generator=g).to(device)
        frames = [first, n]
        ref: Dict[str, Dict[str, Dict[str, torch.Tensor]]] = {}
        orders = [taken] + ([{"layer_major": True}] if len(taken) > 1 and "layer_major" in taken else [])
        for cand in orders:
            order = {**REFERENCE, **{f: chosen[f] for f in chosen if getattr(model, f) is not None}, **cand}

            def run(on: bool, order=order) -> Dict[str, Dict[str, torch.Tensor]]:
                if on:
                    return production_trial(model, codes, ("eager",), frames, **order)
                if "out" not in ref:
                    ref["out"] = production_trial(model, codes, ("eager",), frames, **REFERENCE)
                return ref["out"]
            name = " + ".join(p for p, f in FLAGS.items() if f in cand) + f" ({n}-frame second)"
            v = fastpath.self_check(f"mimi {name}", device, (cfg, n, num_codebooks), run)
            verdicts.append(_named(v, name))
            if v.chosen:
                return {**dict.fromkeys(chosen, False), **cand}
        return dict.fromkeys(chosen, False)
    return check


def _combine(model: MimiDecoder, chosen: Dict[str, bool], check) -> List[Verdict]:
    """Batched calls that each keep the bits, checked together (in :data:`FLAGS` order, greedily: one
    that breaks the bits beside those taken before it is left out and its verdict reported)."""
    taken: Dict[str, bool] = {}
    out: List[Verdict] = []
    for path, flag in list(FLAGS.items())[1:]:
        if not chosen.get(flag) or getattr(model, flag) is not None:
            continue
        if taken:
            name = " + ".join([p for p, f in FLAGS.items() if f in taken] + [path])
            v = check(name, {**taken, flag: True})
            if not v.chosen:
                chosen[flag] = False
                out.append(_named(v, name))
                continue
        taken[flag] = True
    return out


def _named(v: Verdict, path: str) -> Verdict:
    """The verdict under the path's own name (the cache key carries the ``mimi`` prefix)."""
    return Verdict(path, v.chosen, v.reason, v.max_abs_diff, v.cached)
