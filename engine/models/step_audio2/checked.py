"""A block's optional faster paths, each enabled per shape only after the engine's start-up self-check.

cuDNN and cuBLAS choose kernels per shape, memory layout and stream, so a faster path that keeps every
bit at one chunk length on one GPU may not at another. :class:`CheckedPaths` asks
:func:`engine.fastpath.self_check` once per (path, shape) with the block's own trial (reference and
candidate from the same fresh random inputs, ``torch.equal`` on every output), keeps the verdicts for the
session info, and answers which paths run for a shape.

The check runs eagerly. The executor warms every graph signature up eagerly before it captures it, so the
verdicts for captured shapes exist before the capture; a shape first met inside a capture (never, with
the executor's warm-up) runs the reference paths rather than check there.
"""
from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Optional, Sequence

import torch

from engine import fastpath
from engine.fastpath import Verdict

#: trial(shape, path, on) -> the block's outputs (tensors) with ``path`` off (reference) or on
Trial = Callable[[int, str, bool], List[torch.Tensor]]


class CheckedPaths:
    """Verdicts of one block's faster paths, per shape (e.g. the chunk's frame count)."""

    def __init__(self, block: str, paths: Sequence[str], trial: Trial,
                 not_applicable: Optional[Callable[[str, torch.device], Optional[str]]] = None):
        self.block, self.paths, self.trial = block, tuple(paths), trial
        self.not_applicable = not_applicable or (lambda path, device: None)
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
            got = {p: fastpath.self_check(f"{self.block} {p} ({shape} frames)", device, (config, shape),
                                          lambda on, p=p: self.trial(shape, p, on),
                                          not_applicable=self.not_applicable(p, device))
                   for p in self.paths}
            self.checked[shape] = got
        return {p: v.chosen for p, v in got.items()}

    def verdicts(self) -> List[Verdict]:
        """Every verdict so far, by shape, then path."""
        return [v for s in sorted(self.checked) for v in self.checked[s].values()]


def streams_only(path: str, device: torch.device) -> Optional[str]:
    """``not_applicable`` for paths built on CUDA streams (named "... lanes")."""
    return "CUDA streams only" if path.endswith("lanes") and device.type != "cuda" else None
