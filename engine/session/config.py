"""What a duplex session runs: tail, backbone, size, device, checkpoints and the engine toggles."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

TAILS = ("step-audio2", "mimi")
BACKBONES = ("synthetic", "moshi")
SIZES = ("auto", "released", "tiny")
DEVICES = ("auto", "cpu", "cuda")

#: files a Step-Audio2 token2wav checkpoint folder must hold
STEP_AUDIO2_FILES = ("flow.yaml", "flow.pt", "hift.pt")


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


@dataclass
class SessionConfig:
    """Everything that fixes a session; :meth:`resolved` makes it concrete and validates it.

    ``size="auto"`` / ``device="auto"``: released sizes on CUDA when there is a GPU, tiny sizes on
    the CPU otherwise. On the CPU the session leaves one core to audio I/O and the GUI
    (``cpu_threads=0``); small per-token ops gain nothing from more threads, and threads that
    compete for cores make every second slower. ``checkpoint`` is the decoder tail's (a Step-Audio2 folder with flow.yaml,
    flow.pt, hift.pt; or a Mimi ``.safetensors`` file), ``backbone_checkpoint`` the Moshi weights
    folder. The toggles can change between any two seconds without changing one output sample.
    """

    tail: str = "step-audio2"
    backbone: str = "synthetic"
    size: str = "auto"
    device: str = "auto"
    checkpoint: Optional[str] = None
    backbone_checkpoint: Optional[str] = None
    demand_sized: bool = True
    graph_replay: bool = True
    seed: int = 0
    reply_seconds: int = 4          # synthetic policy: longest answer, in seconds
    debug: bool = False             # executor address checks at every replay
    cpu_threads: int = 0            # torch threads on the CPU; 0 = auto: all cores but one (audio, GUI)

    def replace(self, **changes) -> "SessionConfig":
        return dataclasses.replace(self, **changes)

    def resolved(self) -> "SessionConfig":
        """A copy with ``size``/``device`` made concrete; raises ValueError with one clear message."""
        _check_choice("tail", self.tail, TAILS)
        _check_choice("backbone", self.backbone, BACKBONES)
        _check_choice("size", self.size, SIZES)
        _check_choice("device", self.device, DEVICES)
        cuda = _cuda_available()
        device = self.device if self.device != "auto" else ("cuda" if cuda else "cpu")
        if device == "cuda" and not cuda:
            raise ValueError("device 'cuda' was asked for but CUDA is not available (use --device cpu or auto)")
        size = self.size if self.size != "auto" else ("released" if device == "cuda" else "tiny")
        if int(self.cpu_threads) < 0:
            raise ValueError(f"cpu_threads must be 0 (auto) or positive, got {self.cpu_threads}")
        if int(self.reply_seconds) < 1:
            raise ValueError(f"reply_seconds must be at least 1, got {self.reply_seconds}")
        checkpoint = _check_tail_checkpoint(self.tail, self.checkpoint)
        backbone_ckpt = None
        if self.backbone == "moshi":
            if self.tail != "mimi":
                raise ValueError("the moshi backbone speaks Mimi codes: use it with the 'mimi' tail")
            from engine.backbones.moshi_files import validate_folder
            files = validate_folder(self.backbone_checkpoint)
            backbone_ckpt = str(files.folder)
            if checkpoint is None and files.standard_mimi and size == "released":
                checkpoint = str(files.mimi)     # the released Mimi: our decoder reads the same weights
        elif self.backbone_checkpoint is not None:
            raise ValueError("the synthetic backbone has no weights to load: backbone_checkpoint is for 'moshi'")
        return self.replace(size=size, device=device, checkpoint=checkpoint, backbone_checkpoint=backbone_ckpt)


def _check_choice(what: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of: {', '.join(choices)}")


def _check_tail_checkpoint(tail: str, checkpoint: Optional[str]) -> Optional[str]:
    if checkpoint is None or str(checkpoint) == "":
        return None
    p = Path(checkpoint).expanduser()
    if tail == "step-audio2":
        if not p.is_dir():
            raise ValueError(f"Step-Audio2 checkpoint folder {p} does not exist or is not a folder")
        missing = [f for f in STEP_AUDIO2_FILES if not (p / f).is_file()]
        if missing:
            raise ValueError(f"checkpoint folder {p} lacks {', '.join(missing)}")
        return str(p)
    if p.is_dir():                      # a Mimi folder: pick its tokenizer safetensors
        found = sorted(p.glob("tokenizer-*.safetensors")) or sorted(p.glob("*mimi*.safetensors"))
        if not found:
            raise ValueError(f"Mimi checkpoint folder {p} lacks a tokenizer-*.safetensors file")
        return str(found[0])
    if not p.is_file():
        raise ValueError(f"Mimi checkpoint {p} does not exist")
    if p.suffix != ".safetensors":
        raise ValueError(f"Mimi checkpoint {p} is not a .safetensors file")
    return str(p)
