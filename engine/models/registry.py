"""Registry of engine models (decoder tails and the toy test model), by name.

Each model package registers a :class:`ModelEntry` when imported; :func:`load_all` imports the
known packages. ``duplexcadence-bench plan --model NAME`` and ``duplexcadence synth --model NAME``
look models up here.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from engine.core.planner import Plan

#: packages that register models when imported (order = listing order)
KNOWN = ["engine.models.step_audio2", "engine.models.mimi", "engine.models.toy"]


@dataclass
class ModelEntry:
    name: str                                   # "step-audio2", "mimi", "toy"
    title: str                                  # for people
    architecture: str                           # "flow-matching DiT + HiFT", "Mimi SEANet", ...
    plan: Callable[..., Plan]                   # plan(size="released", **session) -> Plan
    make_tail: Optional[Callable[..., object]] = None   # make_tail(size=, device=, seed=, checkpoint=) -> DecoderTail
    synth: Optional[Callable[[object], int]] = None      # synth(argparse.Namespace) -> exit code
    add_synth_args: Optional[Callable[[object], None]] = None  # extra argparse options for synth


_REGISTRY: Dict[str, ModelEntry] = {}
_loaded = False


def register(entry: ModelEntry) -> ModelEntry:
    _REGISTRY[entry.name] = entry
    return entry


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    for mod in KNOWN:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:          # a real missing dependency inside the package: say so
                raise
    _loaded = True


def names() -> List[str]:
    load_all()
    return list(_REGISTRY)


def get(name: str) -> ModelEntry:
    load_all()
    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; registered models: {', '.join(_REGISTRY) or 'none'}")
    return _REGISTRY[name]
