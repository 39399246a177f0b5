"""What a duplex session runs: tail, backbone, size, device, checkpoints and the engine toggles."""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from engine import registry

SIZES = ("auto", "released", "tiny")
DEVICES = ("auto", "cpu", "cuda")
#: what a session prepares between seconds (DuplexSession.ahead): nothing, the TTS steps of a reply past its
#: prepared room (the default), the LLM's forwards of LISTEN, or every forward of the next second
AHEADS = ("off", "tts", "listen", "all")


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


@dataclass
class SessionConfig:
    """Everything that fixes a session; :meth:`resolved` makes it concrete and validates it.

    ``size="auto"`` / ``device="auto"``: released sizes on CUDA when there is a GPU, tiny sizes on
    the CPU otherwise. On the CPU the session leaves one core to audio I/O and the GUI
    (``cpu_threads=0``); small per-token ops gain nothing from more threads, and threads that
    compete for cores make every second slower. ``checkpoint`` is the decoder tail's (each decoder checks its own by content:
    ``registry.resolve_checkpoint``), ``backbone_checkpoint`` the backbone's weights folder (checked by its
    package). ``voice`` is what the tail needs beyond its weights (its :class:`~engine.registry.Conditioning`),
    chosen here once: the file given, else the backbone folder's default voice, else None (a seeded synthetic
    prompt); ``voice_origin`` says which. The toggles can change between any two seconds without changing
    one output sample. ``tail`` / ``backbone`` default to the registry's first ones.
    """

    tail: str = dataclasses.field(default_factory=registry.default_tail)
    backbone: str = dataclasses.field(default_factory=registry.default_backbone)
    size: str = "auto"
    device: str = "auto"
    checkpoint: Optional[str] = None
    backbone_checkpoint: Optional[str] = None
    demand_sized: bool = True
    graph_replay: bool = True
    seed: int = 0
    reply_seconds: int = 4          # synthetic policy: longest answer, in seconds
    debug: bool = False             # executor address checks at every replay
    voice: Optional[str] = None     # the tail's voice file; resolved: the one chosen (None: synthetic prompt)
    voice_origin: str = ""          # resolved: "--voice" | "checkpoint default" | "synthetic" ("" without a voice)
    cpu_threads: int = 0            # torch threads on the CPU; 0 = auto: all cores but one (audio, GUI)
    system_prompt: Optional[str] = None   # the session's system prompt (None: the backbone's declared default)
    input_rate: int = 24000         # the rate of process()'s frames: 24 kHz, or the backbone's declared native rate
    ahead: str = "tts"              # prepared between seconds, off the clock (AHEADS; a backbone without it: none)

    def replace(self, **changes) -> "SessionConfig":
        return dataclasses.replace(self, **changes)

    def resolved(self) -> "SessionConfig":
        """A copy with ``size``/``device``/checkpoints/voice made concrete; ValueError with one clear message."""
        _check_choice("tail", self.tail, registry.tail_names())
        _check_choice("backbone", self.backbone, registry.backbone_names())
        _check_choice("size", self.size, SIZES)
        _check_choice("device", self.device, DEVICES)
        _check_choice("ahead", self.ahead, AHEADS)
        cuda = _cuda_available()
        device = self.device if self.device != "auto" else ("cuda" if cuda else "cpu")
        if device == "cuda" and not cuda:
            raise ValueError("device 'cuda' was asked for but CUDA is not available (use --device cpu or auto)")
        size = self.size if self.size != "auto" else ("released" if device == "cuda" else "tiny")
        if int(self.cpu_threads) < 0:
            raise ValueError(f"cpu_threads must be 0 (auto) or positive, got {self.cpu_threads}")
        _check_seed(self.seed)
        if int(self.reply_seconds) < 1:
            raise ValueError(f"reply_seconds must be at least 1, got {self.reply_seconds}")
        registry.get_backbone(self.backbone).check_tail(self.tail)
        _check_prompted(self.backbone, self.system_prompt)
        check_input_rate(self.backbone, self.input_rate)
        checkpoint = registry.resolve_checkpoint(self.tail, self.checkpoint)   # checked by the decoder
        folder = registry.open_backbone_folder(self.backbone, self.backbone_checkpoint, size)
        if checkpoint is None and folder is not None and folder.tail_checkpoint:
            checkpoint = registry.resolve_checkpoint(self.tail, folder.tail_checkpoint)
        voice, origin = self._voice(checkpoint, folder.voice if folder is not None else None)
        return self.replace(size=size, device=device, checkpoint=checkpoint,
                            backbone_checkpoint=folder.path if folder is not None else None,
                            voice=voice, voice_origin=origin)

    def _voice(self, checkpoint: Optional[str], default: Optional[str]) -> Tuple[Optional[str], str]:
        """(the voice file, checked, or None for the synthetic prompt; how it was chosen): the file asked
        for, else the backbone folder's ``default``; only a tail that declares a conditioning has one."""
        cond = registry.get_tail(self.tail).conditioning
        if cond is None:
            if self.voice:
                tails = " or ".join(registry.conditioned_tails()) or "no"
                raise ValueError(f"a voice prompt is for the {tails} tail; the {self.tail} tail has none")
            return None, ""
        if self.voice:
            path = str(Path(self.voice).expanduser())
            is_default = default is not None and Path(path).resolve() == Path(default).resolve()
            origin = "checkpoint default" if is_default else "--voice"
        else:
            path, origin = default, "checkpoint default" if default else "synthetic"
        if path is not None:
            cond.check(path, checkpoint)
        return path, origin

    def voice_label(self) -> str:
        """The (resolved) voice for people; "" when the tail takes none."""
        cond = registry.get_tail(self.tail).conditioning
        return cond.describe(self.voice, self.voice_origin) if cond is not None else ""


def _check_prompted(backbone: str, prompt: Optional[str]) -> None:
    """ValueError (one line) for a system prompt given to a backbone that declares none."""
    if prompt is None or registry.get_backbone(backbone).system_prompt is not None:
        return
    takers = registry.prompted_backbones()
    names = " or ".join(takers) or "no"
    use = f" or use --backbone {takers[0]}" if takers else ""
    raise ValueError(f"a system prompt is for the {names} backbone; the {backbone} backbone takes none "
                     f"(drop --system-prompt{use})")


#: the largest seed (every generator the session seeds takes a signed 64-bit integer)
MAX_SEED = 2 ** 63 - 1


def check_input_rate(backbone: str, rate) -> None:
    """ValueError (one line) unless ``backbone`` takes frames at ``rate``: 24 kHz, or its declared native rate
    (``BackboneEntry.native_rate``: the stock's own input, handed to it as is)."""
    allowed = registry.get_backbone(backbone).input_rates()
    if isinstance(rate, bool) or not isinstance(rate, int) or rate not in allowed:
        raise ValueError(f"input_rate {rate!r} is not one the {backbone} backbone takes; choose "
                         + " or ".join(f"{r} Hz" for r in allowed))


def _check_seed(seed) -> None:
    """ValueError in one line unless ``seed`` is a whole number from 0 to :data:`MAX_SEED` (a client's hello may
    carry any JSON number: 2**64 would overflow the generators when the session starts)."""
    try:
        ok = not isinstance(seed, bool) and 0 <= operator.index(seed) <= MAX_SEED
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"seed {str(seed)[:40]} is out of range: a seed is an integer from 0 to 2**63-1")


def _check_choice(what: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of: {', '.join(choices)}")
