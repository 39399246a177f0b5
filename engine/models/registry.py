"""The registry of engine models (decoder tails and the toy test model): the only list of decoders.

Each model package registers a :class:`ModelEntry` when imported; :func:`load_all` imports the
packages in :data:`KNOWN`. Everything that names decoders takes the names and titles from here:
the app's tail picker, the session config, the ``--model`` choices of ``duplexcadence run`` /
``synth`` / the scripted app, ``duplexcadence-bench`` (``plan`` and each decoder's own benchmark)
and the tests. A decoder validates its own checkpoint by content (``resolve_checkpoint``): the
session knows no file layouts. Adding a decoder means adding its package under ``engine/models/``:
:func:`load_all` imports every package there, and ``ModelEntry.order`` sets the listing order.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from engine.core.planner import Plan

#: modules of engine/models that are not models
NOT_MODELS = ("registry", "checkfiles")


@dataclass
class ModelEntry:
    """One registered model: what it is called, how to plan, build, check and benchmark it."""

    name: str                                   # "step-audio2", "mimi", "toy"
    title: str                                  # for people
    architecture: str                           # "flow-matching DiT + HiFT", "Mimi SEANet", ...
    plan: Callable[..., Plan]                   # plan(size="released", **session) -> Plan
    #: make_tail(size=, device=, seed=, checkpoint=, shared=) -> DecoderTail
    make_tail: Optional[Callable[..., object]] = None
    synth: Optional[Callable[[object], int]] = None      # synth(argparse.Namespace) -> exit code
    add_synth_args: Optional[Callable[[object], None]] = None  # extra argparse options for synth
    #: resolve_checkpoint(path) -> the path make_tail takes; ValueError (one line) when the contents are wrong
    resolve_checkpoint: Optional[Callable[[str], str]] = None
    checkpoint_hint: str = ""                   # what to choose: "folder with flow.yaml, flow.pt, hift.pt"
    bench: Optional[Tuple[str, str]] = None     # (module with main(argv) -> int, one-line description)
    order: int = 50                             # listing order (the first tail is the default)

    @property
    def is_tail(self) -> bool:
        return self.make_tail is not None


_REGISTRY: Dict[str, ModelEntry] = {}
_loaded = False


def register(entry: ModelEntry) -> ModelEntry:
    _REGISTRY[entry.name] = entry
    return entry


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    import engine.models
    found = [m.name for m in pkgutil.iter_modules(engine.models.__path__) if m.name not in NOT_MODELS]
    for mod in (f"engine.models.{name}" for name in sorted(found)):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:          # a real missing dependency inside the package: say so
                raise
    _loaded = True


def _listed() -> List[ModelEntry]:
    load_all()
    return sorted(_REGISTRY.values(), key=lambda e: (e.order, e.name))


def names() -> List[str]:
    return [e.name for e in _listed()]


def get(name: str) -> ModelEntry:
    load_all()
    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; registered models: {', '.join(_REGISTRY) or 'none'}")
    return _REGISTRY[name]


def tails() -> List[ModelEntry]:
    """The decoder tails a session can run, in listing order."""
    return [e for e in _listed() if e.is_tail]


def tail_names() -> Tuple[str, ...]:
    return tuple(e.name for e in tails())


def get_tail(name: str) -> ModelEntry:
    """The tail called ``name``; ValueError naming the choices otherwise."""
    load_all()
    e = _REGISTRY.get(name)
    if e is None or not e.is_tail:
        raise ValueError(f"unknown tail {name!r}; choose one of: {', '.join(tail_names())}")
    return e


def resolve_checkpoint(tail: str, path: Optional[str]) -> Optional[str]:
    """The checkpoint path ``tail`` will load (None for seeded random weights), checked by content."""
    if path is None or str(path).strip() == "":
        return None
    e = get_tail(tail)
    if e.resolve_checkpoint is None:
        raise ValueError(f"the {e.title} takes no checkpoint")
    return e.resolve_checkpoint(str(path))


def checkpoint_hints() -> str:
    """What each tail's checkpoint is, for help texts: "step-audio2: token2wav folder (...); mimi: ..."."""
    return "; ".join(f"{e.name}: {e.checkpoint_hint}" for e in tails() if e.checkpoint_hint)


def benchmarks() -> Dict[str, Tuple[str, str]]:
    """``duplexcadence-bench`` commands the registered models bring: name -> (module, description)."""
    return {e.name: e.bench for e in _listed() if e.bench is not None}
