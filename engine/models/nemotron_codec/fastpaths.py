"""The codec's batched library calls, each enabled only where the engine's start-up self-check keeps the bits.

The reference makes every shape-dependent library call once per frame at the stock's per-frame shape
(:mod:`.blocks`): that is what makes it equal nemo's one-frame cached decode bit for bit. A whole
second's frames are all known when the step starts, so each such call can instead be made once, with
the second's frames as its batch (:data:`~.blocks.BATCHABLE`: ``pwconv`` the ConvNeXt 1x1 convs,
``convtr`` the transposed convs, ``dwconv`` the depthwise convs, ``head`` the 1x1 conv to the
spectrogram, ``fft`` the inverse FFT, ``mean`` the channel LayerNorm's means). Each output element
is then the same sum of the same products; whether the library sums them in the same order for a
batch of 12-13 frames as for one is up to its kernel heuristics on this GPU. Measured on an H200
(torch 2.11, cuDNN 9): the convolutions and the FFT keep the bits batched, the channel means do not.

:func:`choose` runs each kind against the reference on two seconds of fresh random codes (12 and 13
frames: both step shapes, state carried from one to the next) with the model's own weights, compares
the audio and every state region with ``torch.equal`` (:func:`engine.fastpath.self_check`), checks
the kinds that passed together, and sets :attr:`NemotronCodecDecoder.chosen`. On CUDA each trial runs
both ways production runs a second: eager steps, and graphs captured once and replayed. A ``batched``
given to the model explicitly is kept as given. On the CPU the kinds are not applicable (its elementwise
functions already run frame by frame there; nothing is checked) unless ``check_cpu``.

The verdicts hold for the shapes they were tried at, 12 and 13 frames; the model makes every call per
frame in a step of any other count (a short last second: ``flush``, ``synth``), so no batched call runs
at a shape the check has not seen (:meth:`.model.NemotronCodecDecoder.decode`).
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, FrozenSet, List, Sequence

import torch

from engine import fastpath
from engine.core import Executor, make_plan
from engine.fastpath import Verdict

from .blocks import BATCHABLE
from .model import NemotronCodecDecoder

#: the kinds in the order they are checked and taken (largest saving first, measured on the H200)
ORDER = ("pwconv", "convtr", "dwconv", "head", "fft", "mean")
#: what each kind batches, for the verdict lines
TITLES = {"pwconv": "1x1 convs", "convtr": "transposed convs", "dwconv": "depthwise convs",
          "head": "spectrogram head conv", "fft": "inverse FFTs", "mean": "LayerNorm means"}
TRIAL_SECONDS = 2
TRIAL_SEED = 20261130
assert set(ORDER) == set(BATCHABLE)


def path_name(kinds: Sequence[str]) -> str:
    """``batched 1x1 convs + transposed convs`` for the kinds given (in :data:`ORDER`)."""
    return "batched " + " + ".join(TITLES[k] for k in ORDER if k in kinds)


def trial_codes(model: NemotronCodecDecoder, device) -> torch.Tensor:
    """Seeded random codes [K, frames] for :data:`TRIAL_SECONDS` whole seconds (never zeros)."""
    cfg = model.cfg
    frames = sum(cfg.seconds_pattern()[k % len(cfg.seconds_pattern())] for k in range(TRIAL_SECONDS))
    g = torch.Generator().manual_seed(TRIAL_SEED)
    return torch.randint(0, cfg.codebook_size, (cfg.num_quantizers, frames), generator=g).to(device)


@torch.no_grad()
def decode_trial(model: NemotronCodecDecoder, codes: torch.Tensor, kinds: FrozenSet[str],
                 graphs: bool = False) -> Dict[str, torch.Tensor]:
    """A fresh stream (demand arena) over ``codes`` with ``kinds`` batched: the audio of every whole second
    and every state region after the last one. ``graphs``: the seconds replay graphs captured ahead (as a
    live stream with graph replay on), else they run eagerly. It runs on a shallow copy of the model (same
    weights), so streams already running on the model are not touched."""
    trial = copy.copy(model)
    trial.batched = frozenset(kinds)
    ex = Executor(trial, make_plan(trial.regions(), trial.spec()), codes.device, demand_sized=True,
                  graph_replay=graphs)
    if graphs:
        ex.prepare_graphs(lambda sp: trial.example_inputs(sp, codes.device))
    ex.init_state()
    out, lo, pattern = [], 0, trial.cfg.seconds_pattern()
    for k in range(TRIAL_SECONDS):
        n = pattern[k % len(pattern)]
        out.append(ex.step({"codes": codes[:, lo:lo + n]})["audio"])
        lo += n
    return {"audio": torch.cat(out, dim=-1), "state": ex.arena.export()}


def production_trial(model: NemotronCodecDecoder, codes: torch.Tensor, kinds: FrozenSet[str],
                     modes: Sequence[str]) -> Dict[str, Dict[str, torch.Tensor]]:
    """:func:`decode_trial` in each of ``modes`` (:func:`engine.fastpath.production_modes`)."""
    return {mode: decode_trial(model, codes, kinds, **({"graphs": True} if mode == "graph" else {}))
            for mode in modes}


def choose(model: NemotronCodecDecoder, device, check_cpu: bool = False) -> List[Verdict]:
    """Check the batched kinds here and set ``model.chosen``; the verdicts, one per check.

    Runs before a stream captures its graphs (the trials run on a copy of the model, eagerly and, on CUDA,
    in captured graphs, and leave nothing behind); verdicts are cached per device, library versions, config
    and code, so later streams check nothing."""
    dev = torch.device(device)
    if model.batched is not None:
        given = model.batched_kinds()
        model.chosen = frozenset()
        return [Verdict(path_name(ORDER), bool(given), f"set explicitly by the caller: {sorted(given) or 'none'}")]
    codes = trial_codes(model, dev)
    modes = fastpath.production_modes(dev)
    reference: Dict[str, Dict[str, Dict[str, torch.Tensor]]] = {}

    def trial(kinds: FrozenSet[str]) -> Callable[[bool], Dict[str, Dict[str, torch.Tensor]]]:
        def run(on: bool) -> Dict[str, Dict[str, torch.Tensor]]:
            if on:
                return production_trial(model, codes, kinds, modes)
            if "out" not in reference:
                reference["out"] = production_trial(model, codes, frozenset(), modes)
            return reference["out"]
        return run

    def check(kinds: FrozenSet[str], why=None) -> Verdict:
        name = path_name(kinds)
        v = fastpath.self_check(f"nemotron-codec {name}", dev, (model.cfg, model.cfg.seconds_pattern()),
                                trial(kinds), not_applicable=why)
        return Verdict(name, v.chosen, v.reason, v.max_abs_diff, v.cached)

    why = None if dev.type == "cuda" or check_cpu else \
        "the CPU decodes frame by frame (its elementwise functions' bits depend on an element's place)"
    verdicts = [check(frozenset({k}), why) for k in ORDER]
    passed = frozenset(k for k, v in zip(ORDER, verdicts) if v.chosen)
    model.chosen = _combine(passed, check, verdicts)
    return verdicts


def _combine(passed: FrozenSet[str], check: Callable[[FrozenSet[str]], Verdict],
             verdicts: List[Verdict]) -> FrozenSet[str]:
    """The kinds that each kept the bits, checked together; if they do not together, taken greedily
    in :data:`ORDER` (a kind that breaks the bits beside those taken before it is left out)."""
    if len(passed) < 2:
        return passed
    together = check(passed)
    verdicts.append(together)
    if together.chosen:
        return passed
    taken: FrozenSet[str] = frozenset()
    for k in (k for k in ORDER if k in passed):
        if not taken:
            taken = frozenset({k})
            continue
        v = check(taken | {k})
        verdicts.append(v)
        if v.chosen:
            taken = taken | {k}
    return taken
