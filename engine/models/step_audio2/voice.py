"""The voice token2wav speaks with: a WAV or ``.npz`` the user names, a backbone folder's default voice, or
the seeded synthetic prompt. The Step-Audio2 tail declares it as its :class:`~engine.registry.Conditioning`
(:data:`CONDITIONING`): the session config chooses it once, when it is resolved.

As the stock duplex loop prepares it (``set_stream_cache(prompt_wav)``), a voice is a recording: its
speech tokens (``speech_tokenizer_v2_25hz.onnx``), its 24 kHz mel and its speaker x-vector
(``campplus.onnx``), both ONNX models from the checkpoint's ``assets/token2wav/`` run by onnxruntime
(the ``onnx`` extra); the front-end is :mod:`engine.models.step_audio2.prompt_audio`. An ``.npz`` holding
those three arrays needs neither.

:func:`check_voice` finds every problem it can before anything is built (one ``ValueError`` naming the
file); :func:`load_voice` turns the file into the tail's prompt and names the file in any error the
ONNX models raise.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from engine.registry import Conditioning

ONNX_FILES = ("speech_tokenizer_v2_25hz.onnx", "campplus.onnx")
MIN_SECONDS = 0.5                # shorter gives the speech tokenizer almost nothing to read
MAX_SECONDS = 30.0               # the flow keeps every prompt frame in its caches (2 frames a token)
SUFFIXES = (".wav", ".npz")


@dataclass(frozen=True)
class Voice:
    """Which voice a session speaks with: ``path`` (None: the synthetic prompt) and how it was chosen."""

    path: Optional[str]
    origin: str                   # "--voice" | "checkpoint default" | "synthetic" (see SessionConfig.voice_origin)

    @property
    def label(self) -> str:
        if self.path is None:
            return "synthetic voice prompt (seeded random tokens, mel and x-vector: not a voice)"
        return f"{Path(self.path).name} ({self.origin})"


def check_voice(path: str, token2wav: Optional[str]) -> None:
    """Every problem findable before building: the file, its kind and length, onnxruntime and the two ONNX
    models (``token2wav``: the token2wav folder). One ``ValueError`` naming the file."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"voice file {p} does not exist")
    if not p.is_file():
        raise ValueError(f"voice file {p} is not a regular file")
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"voice file {p}: expected a .wav recording or an .npz prompt "
                         f"(prompt_tokens, prompt_mel, speaker_embedding)")
    if suffix == ".npz":
        return
    _check_recording(p)
    if not token2wav:
        raise ValueError(f"voice file {p}: a recording needs the token2wav folder's ONNX models "
                         f"({', '.join(ONNX_FILES)}): give the backbone folder or --checkpoint")
    for name in ONNX_FILES:
        if not (Path(token2wav) / name).is_file():
            raise ValueError(f"voice file {p} needs {Path(token2wav) / name}, which is missing")
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ValueError(f"voice file {p}: reading a recording needs onnxruntime "
                         f"(pip install 'duplexcadence[onnx]'), or give an .npz prompt") from None


def _check_recording(p: Path) -> None:
    from engine.wavio import AudioReader
    try:
        with AudioReader(p) as r:
            seconds = r.frames / r.rate if r.rate else 0.0
    except (ValueError, RuntimeError, OSError) as e:     # WavError names the file and the reason
        msg = str(e)
        msg = msg[len(str(p)) + 2:] if msg.startswith(f"{p}: ") else msg
        raise ValueError(f"voice file {p}: {msg}") from None
    if seconds < MIN_SECONDS:
        raise ValueError(f"voice file {p} holds {seconds:.2f} s of audio; a voice needs at least "
                         f"{MIN_SECONDS:g} s of speech")
    if seconds > MAX_SECONDS:
        raise ValueError(f"voice file {p} holds {seconds:.1f} s of audio; use at most {MAX_SECONDS:g} s "
                         f"(the token2wav caches keep every prompt frame)")


def load_voice(voice: Voice, token2wav: Optional[str], seed: int = 0):
    """The tail's prompt (:class:`~engine.models.step_audio2.stream.Prompt`) for ``voice``; an error of the
    ONNX models or the front-end comes back as one ``ValueError`` naming the file."""
    from engine.models.step_audio2.prompt import load_prompt, synthetic_prompt
    if voice.path is None:
        return synthetic_prompt(6.0, seed)
    check_voice(voice.path, token2wav)
    try:
        return load_prompt(voice.path, token2wav, seed)
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg if voice.path in msg else f"voice file {voice.path}: {msg}") from None
    except Exception as e:                        # onnxruntime's own exception types (bad model file...)
        raise ValueError(f"voice file {voice.path} could not be turned into a voice prompt: "
                         f"{type(e).__name__}: {e}") from None


def describe(path: Optional[str], origin: str) -> str:
    """The voice for people (the session's info)."""
    return Voice(path, origin).label


def load(path: Optional[str], token2wav: Optional[str], seed: int = 0):
    """The tail's prompt for the voice file ``path`` (None: the synthetic prompt)."""
    return load_voice(Voice(path, "--voice" if path else "synthetic"), token2wav, seed)


CONDITIONING = Conditioning(keyword="prompt", check=check_voice, load=load, describe=describe,
                            help="a recording (.wav, read with the token2wav folder's ONNX models; needs "
                                 "onnxruntime) or an .npz prompt (prompt_tokens, prompt_mel, speaker_embedding)")
