"""The contract between a streaming model and the engine.

A model is a plain ``nn.Module`` that knows nothing of how it is run (cf. gpt-fast): it *declares*
its state regions and clocks for a session, fills the initial state from a prompt, and computes one
step from explicit state handles. The planner derives shapes, the arena allocates, the executor
runs eagerly or captures and replays one CUDA graph per shape signature.

Rules a ``step`` must follow so that graph replay is exact (REFERENCE.md §5):
* mutate state only through the handles (``grow()`` / ``tail()`` / ``get()`` views with ``copy_``,
  ``index_copy_``, ``[...] =``, or ``set(x)``); never keep a tensor across steps;
* use ``state[name].position()`` / ``state.step_counter`` (device tensors) for anything that changes
  from step to step within one signature (ring offsets, RoPE positions, noise offsets);
* no host syncs (``.item()``, ``nonzero``, data-dependent shapes, pageable host->device copies);
* random draws only from the device's default generator, in the same order as eager.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

import torch
from torch import nn

from .planner import StepPlan
from .regions import Region, SessionSpec


class StateView(Mapping):
    """What a step sees: region handles by name, plus the device-side step counter."""

    def __init__(self, arena):
        self._arena = arena

    def __getitem__(self, name):
        return self._arena.states[name]

    def __iter__(self):
        return iter(self._arena.states)

    def __len__(self):
        return len(self._arena.states)

    @property
    def step_counter(self) -> torch.Tensor:
        return self._arena.step_counter

    def under(self, prefix: str) -> "ScopedState":
        """The handles of a sub-module whose regions were declared under ``prefix`` (see
        :func:`engine.core.regions.prefixed`): it reads ``state["cache"]`` for ``prefix.cache``."""
        return ScopedState(self, prefix)


class ScopedState(Mapping):
    """A sub-module's view of the state: its own short region names, resolved under a prefix."""

    def __init__(self, base: Mapping, prefix: str):
        self._base, self._prefix = base, f"{prefix}." if prefix else ""

    def __getitem__(self, name: str):
        return self._base[self._prefix + name]

    def __iter__(self):
        n = len(self._prefix)
        return (k[n:] for k in self._base if k.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @property
    def step_counter(self) -> torch.Tensor:
        return self._base.step_counter

    def under(self, prefix: str) -> "ScopedState":
        return ScopedState(self, prefix)


class StreamingModel(nn.Module):
    """Base class of every engine model (decoder tails and toy test models)."""

    #: registry name, e.g. "step-audio2", "mimi"
    name: str = "abstract"
    #: what, besides the shapes, changes what :meth:`step` runs: ``"last"`` (``plan.is_last``) and ``"first"``
    #: (``plan.index == 0``). The executor captures one graph per shape signature and each of these (a model that
    #: reads neither shares one graph between a first or last step and the others of the same shapes)
    step_branches: Tuple[str, ...] = ()

    def regions(self, spec: SessionSpec) -> List[Region]:
        """Declare every state region (with clock and retention) for this session."""
        raise NotImplementedError

    def init_state(self, state: StateView, prompt: Dict[str, torch.Tensor]) -> None:
        """Fill the state before step 0 (prompt prefill). Runs eagerly, once."""

    def example_inputs(self, plan: StepPlan, device) -> Dict[str, torch.Tensor]:
        """Random inputs with the shapes of ``plan``'s step (for ahead-of-time graph capture)."""
        raise NotImplementedError

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        """One step. ``plan`` holds the exact lengths (host ints, fixed per signature)."""
        raise NotImplementedError
