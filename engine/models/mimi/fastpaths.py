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
passed. A flag the caller set explicitly on :class:`~engine.models.mimi.model.MimiDecoder` (True
or False) is kept as given and reported as such.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional

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
def decode_trial(model: MimiDecoder, codes: torch.Tensor, **order: bool) -> Dict[str, torch.Tensor]:
    """A fresh stream (demand arena, eager) over ``codes`` [K, frames] in the given order: the audio
    [1, 1, N] of every whole second and every state region after the last one."""
    cfg = model.cfg
    with flags(model, **order):
        ex = Executor(model, make_plan(model.regions(), model.spec()), codes.device, demand_sized=True,
                      graph_replay=False)
        ex.init_state()
        out, k = [], 0
        while cfg.frames_before(k + 1) <= codes.shape[1]:
            out.append(ex.step({"codes": codes[:, cfg.frames_before(k):cfg.frames_before(k + 1)]})["audio"])
            k += 1
        state = ex.arena.export()
    return {"audio": torch.cat(out, dim=-1), "state": state}


#: the reference order: frame-major, every library call at moshi's shapes
REFERENCE: Dict[str, bool] = {flag: False for flag in FLAGS.values()}


def _candidate(path: str) -> Dict[str, bool]:
    """Layer-major order with ``path``'s flag on, every other one off."""
    return {**REFERENCE, "layer_major": True, FLAGS[path]: True}


def choose(model: MimiDecoder, device, num_codebooks: int = 8, check_cpu: bool = False) -> List[Verdict]:
    """Check Mimi's faster orders here and set the model's chosen flags; the verdicts, one per path.

    Runs before a stream captures its graphs (the trials run eagerly on the model's own weights and
    leave nothing behind). Verdicts are cached per device, library versions and config, so a second
    stream of the same model checks nothing. On the CPU the orders are not applicable (the trials
    cost seconds at the released size, and its ELU differs by layout) unless ``check_cpu``.
    """
    dev = torch.device(device)
    cfg = model.cfg
    codes = trial_codes(model, num_codebooks, dev)
    reference: Dict[str, Dict[str, torch.Tensor]] = {}     # decoded once, when a check first needs it

    def trial(candidate: Dict[str, bool]):
        def run(on: bool) -> Dict[str, torch.Tensor]:
            if on:
                return decode_trial(model, codes, **candidate)
            if not reference:
                reference["out"] = decode_trial(model, codes, **REFERENCE)
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
        v = fastpath.self_check(f"mimi {path}", dev, cfg, trial(_candidate(path)), not_applicable=why)
        verdicts.append(_named(v, path))
        chosen[flag] = v.chosen
    verdicts += _combine(model, chosen, lambda path, flags: fastpath.self_check(
        f"mimi {path}", dev, cfg, trial(dict(REFERENCE, layer_major=True, **flags))))
    model.chosen = dict(chosen)
    return verdicts


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
