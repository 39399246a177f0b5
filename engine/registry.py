"""The registry of engine parts: the only list of decoder tails (and the toy test model) and of backbones.

Each part is a package that registers one frozen entry when imported: decoders a :class:`ModelEntry`
(packages and modules under ``engine/models/``), backbones a :class:`BackboneEntry` (packages under
``engine/backbones/``). :func:`load_all` imports every one of them by itself (``pkgutil``), plus the
packages in each folder of ``$DUPLEXCADENCE_PARTS`` (``os.pathsep``-separated) or of
:func:`add_search_path`: adding a part is adding a package, nothing else.

What a part *is* is declared on its entry and read here, in one place (vLLM's model registry): which
tails a backbone pairs with, whether it speaks in turns or skips the tail while listening, how a
checkpoint is checked by content, what a backbone's folder brings along (a tail checkpoint, a default
voice), how a backbone has its tail built (``tail_options``: MiniCPM-o's 5 flow steps) and cut its tokens
into steps (``tail_chunking``: MiniCPM-o's chunks of 8 tokens and up), what a tail needs
beyond its weights (:class:`Conditioning`), the command-line options a decoder's ``synth`` adds, and what a
backbone may offer a session: a system prompt and its default, a native input rate, a reference clip, a
forced listen, stage marks, work it prepares ahead, the steps a scheduler may batch and its measured memory.
Everything that names parts takes the names, titles and defaults from here: the session config, the
host, the serve layer, the CLIs, the benches and the app.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from engine.audio import SESSION_RATE

#: modules of engine/models that are not models
NOT_MODELS = ("registry", "checkfiles")
#: where extra part packages may live (folders holding packages), besides engine/models and engine/backbones
ENV_PATHS = "DUPLEXCADENCE_PARTS"
#: the steps a device's scheduler knows how to batch across sessions (BackboneEntry.batched_steps): "llm", a
#: one-token forward of an LLM every session of the same weights makes (engine/host/scheduler.py)
BATCHED_STEPS = ("llm",)


@dataclass(frozen=True)
class Option:
    """One command-line option a part adds, as data: the command that reads it turns ``kind`` into its own
    argument check ("file": a file it reads, "count": a positive whole number, "text": as given)."""

    flag: str                                  # "--codes"
    help: str
    kind: str = "text"
    default: object = None
    metavar: Optional[str] = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def add_to(self, group, checks: Dict[str, Callable[[str], object]]) -> None:
        kw = {"help": self.help, "default": self.default}
        if checks.get(self.kind) is not None:
            kw["type"] = checks[self.kind]
        if self.metavar is not None:
            kw["metavar"] = self.metavar
        group.add_argument(self.flag, **kw)


@dataclass(frozen=True)
class Conditioning:
    """What a tail needs beyond its weights (the Step-Audio2 voice prompt), chosen once, when a session's
    config is resolved, from ``SessionConfig.voice`` or the backbone folder's default; the resolved config
    carries the choice (``voice``, ``voice_origin``) and the shared-weights key includes it."""

    keyword: str                                              # make_tail's keyword: "prompt"
    check: Callable[[str, Optional[str]], None]               # check(file, tail checkpoint): one ValueError
    load: Callable[[Optional[str], Optional[str], int], object]   # load(file or None, checkpoint, seed)
    describe: Callable[[Optional[str], str], str]             # describe(file or None, origin) for people
    help: str                                                 # what a file is, for help texts


@dataclass(frozen=True)
class ModelEntry:
    """One registered model: what it is called, how to plan, build, check and benchmark it."""

    name: str                                   # "step-audio2", "mimi", "toy"
    title: str                                  # for people
    architecture: str                           # "flow-matching DiT + HiFT", "Mimi SEANet", ...
    plan: Callable[..., object]                 # plan(size="released", **session) -> Plan
    #: make_tail(size=, device=, seed=, checkpoint=, shared=, [conditioning.keyword]=) -> DecoderTail
    make_tail: Optional[Callable[..., object]] = None
    synth: Optional[Callable[[object], int]] = None      # synth(argparse.Namespace) -> exit code
    options: Tuple[Option, ...] = ()            # the options its synth command reads
    #: resolve_checkpoint(path) -> the path make_tail takes; ValueError (one line) when the contents are wrong
    resolve_checkpoint: Optional[Callable[[str], str]] = None
    checkpoint_hint: str = ""                   # what to choose: "folder with flow.yaml, flow.pt, hift.pt"
    conditioning: Optional[Conditioning] = None
    bench: Optional[Tuple[str, str]] = None     # (module with main(argv) -> int, one-line description)
    order: int = 50                             # listing order (the first tail is the default)

    @property
    def is_tail(self) -> bool:
        return self.make_tail is not None


@dataclass(frozen=True)
class TailChunking:
    """How a backbone has its tail cut the tokens pushed to it into steps when not only into full steps: every
    push decodes all it can, in chunks of at most a full step, down to a chunk of ``min_frames`` new frames
    plus the tail's lookahead (MiniCPM-o 4.5's duplex loop, its ``force_flush``: any buffer of pre-lookahead
    + 5 = 8 tokens); such chunks are steps of an :class:`engine.tail.DeclaredPlan`. A backbone without one
    (``BackboneEntry.tail_chunking`` None) has its tail wait for full steps."""

    min_frames: int                             # the fewest new frames a chunk decodes (5 for MiniCPM-o 4.5)

    def __post_init__(self) -> None:
        n = self.min_frames
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"TailChunking.min_frames: a positive whole number of frames, got {n!r}")


@dataclass(frozen=True)
class BackboneFolder:
    """A backbone's weights folder, checked by content, and what it brings for the rest of the session."""

    path: str
    tail_checkpoint: Optional[str] = None       # the tail's weights the folder holds (used when none is given)
    voice: Optional[str] = None                 # the folder's default voice (a tail's conditioning)


@dataclass(frozen=True)
class MeasuredMemory:
    """What one session of a backbone was measured to reserve on a GPU, for the out-of-memory message."""

    size: str                                   # "released"
    gib: float                                  # the torch allocator's peak reserved GiB
    where: str                                  # how and where it was measured, with the result's file


@dataclass(frozen=True)
class BackboneEntry:
    """One registered backbone (LISTEN + THINK) and its traits, declared here and read nowhere else."""

    name: str                                   # "synthetic", "moshi", ...
    title: str                                  # for people (the app's picker)
    #: make(fmt, size=, device=, seed=, checkpoint=, demand_sized=, graph_replay=, reply_seconds=, debug=,
    #: shared=) -> Backbone; the package imports heavy dependencies only inside it
    make: Callable[..., object]
    tails: Tuple[str, ...] = ()                 # the tails whose tokens it speaks (empty: any tail)
    speaks: str = ""                            # those tokens in words, for the pairing error
    speaks_in_turns: bool = False               # ends replies with Thought.turn_end (tail keeps a turn base)
    listen_skips_tail: bool = False             # a listening second runs no tail (the second plays silence)
    #: open_folder(path, size) -> BackboneFolder; one ValueError when the contents are wrong
    open_folder: Optional[Callable[[str, str], BackboneFolder]] = None
    needs_folder: bool = False                  # no seeded random weights without a folder
    folder_hint: str = ""                       # "weights folder (model.safetensors, Mimi, tokenizer)"
    #: owns_folder(path): a folder given as the *tail* checkpoint is really this backbone's
    owns_folder: Optional[Callable[[str], bool]] = None
    order: int = 50                             # listing order (the first backbone is the default)
    #: keywords for its tail's make_tail, as its own stock loop builds the tail (MiniCPM-o 4.5: 5 flow
    #: steps); a mapping, kept as sorted (name, value) pairs so the entry stays hashable
    tail_options: Tuple[Tuple[str, object], ...] = ()
    #: how its tail cuts the pushed tokens into steps (MiniCPM-o 4.5: every buffer of 5 + lookahead tokens);
    #: None: full steps only
    tail_chunking: Optional[TailChunking] = None
    # -- what it may offer a session (each read by the session, the config or the host; none by default) ----
    #: the system prompt it starts from when none is given; None: it takes no system prompt
    system_prompt: Optional[str] = None
    #: an input rate it takes besides the session's 24 kHz, handed to it as is (MiniCPM-o 4.5: 16 kHz)
    native_rate: Optional[int] = None
    #: it takes the session's voice file as its reference clip (``make(reference_audio=voice)``)
    reference_clip: bool = False
    #: it holds a forced listen of its own (``Backbone.force_listen``: the second listens, a reply is closed)
    force_listen: bool = False
    #: the parts of THINK it marks on the session's stage clock (``Backbone.stage_mark``: "tts")
    stage_marks: Tuple[str, ...] = ()
    #: the scopes of work it can prepare between seconds, off the clock (``Backbone.prepare_ahead``)
    ahead: Tuple[str, ...] = ()
    #: the steps a device's scheduler may batch across sessions of shared weights, where a start-up check passes:
    #: "llm" (one-token LLM forwards; the backbone's ``batch_runner`` makes the runner)
    batched_steps: Tuple[str, ...] = ()
    #: what a session was measured to reserve: (size, GiB the torch allocator reserved at its peak, where)
    measured_memory: Tuple[MeasuredMemory, ...] = ()
    #: its stock loop hands the tail's speech on as 16-bit PCM (MiniCPM-o 4.5: Step-Audio2's ``Token2wav.stream``
    #: returns PCM bytes, which the loop reads back as float): the tail's audio takes the same step
    #: (:data:`engine.tail.DecoderTail.pcm16`)
    speech_pcm16: bool = False
    #: its stock loop returns each speaking second as at least a second of audio: shorter speech that does not end
    #: its turn comes after silence up to a second, and a speaking second that decoded nothing is a second of
    #: silence (MiniCPM-o 4.5's ``_generate_waveform_from_tokens``); :func:`engine.tail.whole_second`
    pads_short_speech: bool = False

    def __post_init__(self) -> None:
        opts = self.tail_options
        pairs = opts.items() if isinstance(opts, dict) else opts
        object.__setattr__(self, "tail_options", tuple(sorted((str(k), v) for k, v in pairs)))
        for name in ("stage_marks", "ahead", "batched_steps", "measured_memory"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        unknown = set(self.batched_steps) - set(BATCHED_STEPS)
        if unknown:
            raise ValueError(f"{self.name}: batched_steps {sorted(unknown)} unknown; known: {', '.join(BATCHED_STEPS)}")
        rate = self.native_rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0):
            raise ValueError(f"{self.name}: native_rate must be a positive whole number of Hz, got {rate!r}")

    def input_rates(self) -> Tuple[int, ...]:
        """The rates a session of this backbone takes frames at: 24 kHz and its native rate, ascending."""
        return tuple(sorted({SESSION_RATE, self.native_rate or SESSION_RATE}))

    def default_input_rate(self) -> int:
        """The rate a new session starts with: its native rate where it has one (the stock's own front end)."""
        return int(self.native_rate or SESSION_RATE)

    def memory_for(self, size: str) -> Optional[MeasuredMemory]:
        """The measured memory of a session at ``size`` (None where none was measured)."""
        return next((m for m in self.measured_memory if m.size == size), None)

    def tail_kwargs(self) -> Dict[str, object]:
        """The keywords its tail is built with (``make_tail(**tail_kwargs())``)."""
        return dict(self.tail_options)

    def check_tail(self, tail: str) -> None:
        """ValueError (one line) when ``tail`` cannot read this backbone's tokens."""
        if self.tails and tail not in self.tails:
            choices = " or ".join(repr(t) for t in self.tails)
            raise ValueError(f"the {self.name} backbone speaks {self.speaks or 'other tokens'}: use it with the "
                             f"{choices} tail")


_MODELS: Dict[str, ModelEntry] = {}
_BACKBONES: Dict[str, BackboneEntry] = {}
_extra: List[str] = []
_loaded = False


def register(entry: ModelEntry) -> ModelEntry:
    """Register a decoder (called by its package on import)."""
    _MODELS[entry.name] = entry
    return entry


def register_backbone(entry: BackboneEntry) -> BackboneEntry:
    """Register a backbone (called by its package on import)."""
    _BACKBONES[entry.name] = entry
    return entry


def add_search_path(folder: str) -> None:
    """Also discover the part packages in ``folder`` (tests, plug-ins); takes effect at the next listing."""
    global _loaded
    folder = str(folder)
    if folder not in _extra:
        _extra.append(folder)
        _loaded = False


def _import(mod: str) -> None:
    try:
        importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name != mod:                  # a real missing dependency inside the package: say so
            raise


def _search_paths() -> List[str]:
    env = [p for p in os.environ.get(ENV_PATHS, "").split(os.pathsep) if p]
    return _extra + [p for p in env if p not in _extra]


def _found(package: str):
    """The modules of ``package``, listed from its search path (``__path__``, also in a frozen app) without
    importing anything of it here: the registry imports no part package at module level or by name."""
    paths = importlib.util.find_spec(package).submodule_search_locations
    return sorted(pkgutil.iter_modules(list(paths)), key=lambda m: m.name)


def load_all() -> None:
    """Import every part package once (and those of search paths added since)."""
    global _loaded
    if _loaded:
        return
    for m in _found("engine.models"):
        if m.name not in NOT_MODELS:
            _import(f"engine.models.{m.name}")
    for m in _found("engine.backbones"):
        if m.ispkg:                        # modules beside the packages (base, policy) are shared code
            _import(f"engine.backbones.{m.name}")
    for folder in _search_paths():
        if folder not in sys.path:
            sys.path.append(folder)
        for m in sorted(pkgutil.iter_modules([folder]), key=lambda m: m.name):
            if m.ispkg:
                _import(m.name)
    _loaded = True


# -- decoders ----------------------------------------------------------------------------------------------
def _listed() -> List[ModelEntry]:
    load_all()
    return sorted(_MODELS.values(), key=lambda e: (e.order, e.name))


def names() -> List[str]:
    return [e.name for e in _listed()]


def get(name: str) -> ModelEntry:
    load_all()
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; registered models: {', '.join(_MODELS) or 'none'}")
    return _MODELS[name]


def tails() -> List[ModelEntry]:
    """The decoder tails a session can run, in listing order."""
    return [e for e in _listed() if e.is_tail]


def tail_names() -> Tuple[str, ...]:
    return tuple(e.name for e in tails())


def default_tail() -> str:
    """The tail a session runs unless told otherwise: the first in listing order."""
    return tail_names()[0]


def get_tail(name: str) -> ModelEntry:
    """The tail called ``name``; ValueError naming the choices otherwise."""
    load_all()
    e = _MODELS.get(name)
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


def conditioned_tails() -> Tuple[str, ...]:
    """The tails that take a voice (a :class:`Conditioning`)."""
    return tuple(e.name for e in tails() if e.conditioning is not None)


def benchmarks() -> Dict[str, Tuple[str, str]]:
    """``duplexcadence-bench`` commands the registered models bring: name -> (module, description)."""
    return {e.name: e.bench for e in _listed() if e.bench is not None}


# -- backbones ---------------------------------------------------------------------------------------------
def backbones() -> List[BackboneEntry]:
    """The backbones a session can run, in listing order."""
    load_all()
    return sorted(_BACKBONES.values(), key=lambda e: (e.order, e.name))


def backbone_names() -> Tuple[str, ...]:
    return tuple(e.name for e in backbones())


def default_backbone() -> str:
    return backbone_names()[0]


def get_backbone(name: str) -> BackboneEntry:
    """The backbone called ``name``; ValueError naming the choices otherwise."""
    load_all()
    e = _BACKBONES.get(name)
    if e is None:
        raise ValueError(f"unknown backbone {name!r}; choose one of: {', '.join(backbone_names())}")
    return e


def folder_backbones() -> Tuple[str, ...]:
    """The backbones that load a weights folder."""
    return tuple(e.name for e in backbones() if e.open_folder is not None)


def prompted_backbones() -> Tuple[str, ...]:
    """The backbones that take a system prompt (``BackboneEntry.system_prompt``)."""
    return tuple(e.name for e in backbones() if e.system_prompt is not None)


def folder_hints() -> str:
    """What each backbone's weights folder is, for help texts."""
    return "; ".join(f"{e.name}: {e.folder_hint}" for e in backbones() if e.folder_hint)


def open_backbone_folder(name: str, path: Optional[str], size: str) -> Optional[BackboneFolder]:
    """Backbone ``name``'s folder checked by content (None: seeded random weights); one ValueError."""
    e = get_backbone(name)
    if e.open_folder is None:
        if path is not None:
            raise ValueError(f"the {name} backbone has no weights to load: a backbone folder is for "
                             + " and ".join(repr(n) for n in folder_backbones()))
        return None
    if not path and not e.needs_folder:
        return None
    return e.open_folder(path, size)


# -- command lines -----------------------------------------------------------------------------------------
def add_options(parser, entries: List[ModelEntry], checks: Optional[Dict[str, Callable[[str], object]]] = None) -> None:
    """Each entry's own options, in a group named after it; a flag an earlier entry added is shared.
    ``checks``: the command's argument checks by :attr:`Option.kind`."""
    seen = set()
    for e in entries:
        fresh = [o for o in e.options if o.flag not in seen]
        if not fresh:
            continue
        group = parser.add_argument_group(e.name)
        for o in fresh:
            o.add_to(group, checks or {})
            seen.add(o.flag)


def file_options(entries: List[ModelEntry]) -> Tuple[str, ...]:
    """The argparse destinations of the entries' options that name files the command reads."""
    return tuple(dict.fromkeys(o.dest for e in entries for o in e.options if o.kind == "file"))
