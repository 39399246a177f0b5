"""A block's optional faster paths, each enabled per shape only after the engine's start-up self-check.

cuDNN and cuBLAS choose kernels per shape, memory layout and stream, so a faster path that keeps every
bit at one chunk length on one GPU may not at another. :class:`CheckedPaths` asks
:func:`engine.fastpath.self_check` once per (path, shape) with the block's own trial (reference and
candidate from the same fresh random inputs, ``torch.equal`` on every output), keeps the verdicts for the
session info, and answers which paths run for a shape.

The trial runs the way production runs the block: on the CPU eagerly; on CUDA both eagerly and captured
into a CUDA graph and replayed (:func:`engine.fastpath.replayed`), since a stream steps eagerly or replays
graphs as its toggles say. A path taken only while a graph is captured (``captured_only``: the fused
Triton kernel, which eager steps leave to PyTorch's kernels) is tried only in a capture, and its verdict
says so (``on (inside captured graphs only)``). The executor warms every graph signature up eagerly
before it captures it, so the verdicts for captured shapes exist before the capture; a shape first met
inside a capture (never, with the executor's warm-up) runs the reference paths rather than check there.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Hashable, List, Optional, Sequence

import torch

from engine import fastpath
from engine.fastpath import Verdict

#: inputs(shape, path) -> fresh seeded random inputs on the block's device (made outside any capture)
Inputs = Callable[[int, str], List[torch.Tensor]]
#: trial(shape, path, on, inputs) -> the block's outputs (tensors) with ``path`` off (reference) or on;
#: it may change its inputs in place (caches), and makes no host-to-device copies (it may be captured)
Trial = Callable[[int, str, bool, List[torch.Tensor]], List[torch.Tensor]]


class CheckedPaths:
    """Verdicts of one block's faster paths, per shape (e.g. the chunk's frame count)."""

    def __init__(self, block: str, paths: Sequence[str], trial: Trial, inputs: Inputs,
                 not_applicable: Optional[Callable[[str, torch.device], Optional[str]]] = None,
                 captured_only: Optional[Callable[[str], bool]] = None,
                 prepare: Optional[Callable[[str], None]] = None):
        self.block, self.paths, self.trial, self.inputs = block, tuple(paths), trial, inputs
        #: called with a path each time a shape's check chooses it (outside any capture): makes what the path
        #: reads (e.g. weights in another layout) once, so the per-call :meth:`which` stays a lookup
        self.prepare = prepare or (lambda path: None)
        self.not_applicable = not_applicable or (lambda path, device: None)
        self.captured_only = captured_only or (lambda path: False)
        self.checked: Dict[int, Dict[str, Verdict]] = {}
        #: True: every shape runs the reference paths, unchecked (a bench's "before", a user's choice)
        self.reference_only = False

    def clear(self) -> None:
        """Forget this block's verdicts (weights or device changed); the process cache may answer again."""
        self.checked = {}

    def which(self, shape: int, device: torch.device, config: Hashable) -> Dict[str, bool]:
        """``{path: runs}`` for ``shape``; checks the shape's paths first if this block has not yet."""
        got = self.checked.get(shape)
        if got is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return {p: False for p in self.paths}
            if self.reference_only:
                got = {p: Verdict(f"{self.block} {p} ({shape} frames)", False, "reference path asked for")
                       for p in self.paths}
                self.checked[shape] = got
                return {p: False for p in self.paths}
            got = {p: self._check(shape, p, device, config) for p in self.paths}
            self.checked[shape] = got
            for p, v in got.items():
                if v.chosen:
                    self.prepare(p)
        return {p: v.chosen for p, v in got.items()}

    def _check(self, shape: int, path: str, device: torch.device, config: Hashable) -> Verdict:
        """One path at one shape, run in each way production runs it (:func:`engine.fastpath.production_modes`)."""
        only = self.captured_only(path)
        modes = fastpath.production_modes(device, captured_only=only)
        why = self.not_applicable(path, device) or (None if modes else "it runs only inside captured CUDA graphs")
        v = fastpath.self_check(f"{self.block} {path} ({shape} frames)", device, (config, shape, modes),
                                lambda on: self.run(shape, path, on, device, modes), not_applicable=why)
        return replace(v, scope=fastpath.CAPTURED_ONLY) if only and v.chosen else v

    def run(self, shape: int, path: str, on: bool, device: torch.device,
            modes: Sequence[str] = ("eager",)) -> Dict[str, List[torch.Tensor]]:
        """The trial's outputs in each of ``modes`` (``eager``; ``graph``: captured and replayed), each from
        fresh inputs."""
        out: Dict[str, List[torch.Tensor]] = {}
        for mode in modes:
            inputs = self.inputs(shape, path)
            if mode == "graph":
                out[mode] = fastpath.replayed(lambda: self.trial(shape, path, on, inputs), device, restore=inputs)
            else:
                out[mode] = self.trial(shape, path, on, inputs)
        return out

    def verdicts(self) -> List[Verdict]:
        """Every verdict so far, by shape, then path."""
        return [v for s in sorted(self.checked) for v in self.checked[s].values()]


def streams_only(path: str, device: torch.device) -> Optional[str]:
    """``not_applicable`` for paths built on CUDA streams (named "... lanes")."""
    return "CUDA streams only" if path.endswith("lanes") and device.type != "cuda" else None
