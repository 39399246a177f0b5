"""What a duplex session runs: tail, backbone, size, device, checkpoints and the engine toggles."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

BACKBONES = ("synthetic", "moshi", "minicpm-o-4.5")
SIZES = ("auto", "released", "tiny")
DEVICES = ("auto", "cpu", "cuda")


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
    ``registry.resolve_checkpoint``), ``backbone_checkpoint`` the Moshi weights
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
    voice: Optional[str] = None     # step-audio2 voice prompt (.wav / .npz); None: a MiniCPM-o folder's
                                    # assets/HT_ref_audio.wav, else the synthetic prompt (engine/backbones/minicpmo45/voice.py)
    cpu_threads: int = 0            # torch threads on the CPU; 0 = auto: all cores but one (audio, GUI)

    def replace(self, **changes) -> "SessionConfig":
        return dataclasses.replace(self, **changes)

    def resolved(self) -> "SessionConfig":
        """A copy with ``size``/``device`` made concrete; raises ValueError with one clear message."""
        from engine.models import registry     # the only list of decoder tails
        _check_choice("tail", self.tail, registry.tail_names())
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
        checkpoint = registry.resolve_checkpoint(self.tail, self.checkpoint)   # checked by the decoder
        backbone_ckpt = None
        if self.backbone == "moshi":
            if self.tail != "mimi":
                raise ValueError("the moshi backbone speaks Mimi codes: use it with the 'mimi' tail")
            from engine.backbones.moshi.files import validate_folder
            files = validate_folder(self.backbone_checkpoint)
            backbone_ckpt = str(files.folder)
            if checkpoint is None and files.standard_mimi and size == "released":
                checkpoint = str(files.mimi)     # the released Mimi: our decoder reads the same weights
        elif self.backbone == "minicpm-o-4.5":
            if self.tail != "step-audio2":
                raise ValueError("the minicpm-o-4.5 backbone speaks Step-Audio2 tokens: use it with the "
                                 "'step-audio2' tail")
            if self.backbone_checkpoint:
                from engine.backbones.minicpmo45.weights import open_folder
                folder = open_folder(self.backbone_checkpoint)       # one clear error for a broken folder
                backbone_ckpt = str(folder.path)
                if checkpoint is None and folder.token2wav is not None:
                    checkpoint = registry.resolve_checkpoint(self.tail, str(folder.token2wav))
        elif self.backbone_checkpoint is not None:
            raise ValueError("the synthetic backbone has no weights to load: backbone_checkpoint is for "
                             "'moshi' and 'minicpm-o-4.5'")
        voice = self._voice(checkpoint, backbone_ckpt if self.backbone == "minicpm-o-4.5" else None)
        return self.replace(size=size, device=device, checkpoint=checkpoint, backbone_checkpoint=backbone_ckpt,
                            voice=voice)

    def _voice(self, checkpoint: Optional[str], minicpm_folder: Optional[str]) -> Optional[str]:
        """The voice file (checked), or None for the synthetic prompt; only the step-audio2 tail has one."""
        if self.tail != "step-audio2":
            if self.voice:
                raise ValueError(f"a voice prompt is for the step-audio2 tail; the {self.tail} tail has none")
            return None
        from engine.backbones.minicpmo45.voice import check_voice, choose
        v = choose(self.voice, minicpm_folder)
        if v.path is not None:
            check_voice(v.path, checkpoint)
        return v.path


def _check_choice(what: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of: {', '.join(choices)}")
