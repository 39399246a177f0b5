"""What a session's system prompt may be, and the prompt a backbone starts from when none is given.

One rule for every way a prompt arrives — the app's field, ``duplexcadence run --system-prompt`` and a
client's hello to a server (untrusted input): text, not blank, at most :data:`MAX_CHARS` characters, no
control characters but newlines and tabs (a NUL, an escape sequence or a lone surrogate is refused, not
passed to the tokenizer). :func:`check` raises ValueError with one line saying what is wrong and where.

A backbone that takes a system prompt declares it, with its default, on its registry entry
(``BackboneEntry.system_prompt``); :func:`default_for` gives that default and None for a backbone that takes
none, :func:`takes_prompt` says which.
"""
from __future__ import annotations

import unicodedata
from typing import Optional, Tuple

from engine import registry

#: the longest system prompt accepted (the MiniCPM-o demo's presets are a few hundred characters)
MAX_CHARS = 4000
#: the control characters a prompt may hold (it is multi-line text)
ALLOWED_CONTROLS = frozenset("\n\t")


def default_for(backbone: str) -> Optional[str]:
    """The system prompt ``backbone`` starts from when none is given; None when it takes none (or is unknown)."""
    if backbone not in registry.backbone_names():
        return None
    return registry.get_backbone(backbone).system_prompt


def takes_prompt(backbone: str) -> bool:
    return default_for(backbone) is not None


def __getattr__(name: str) -> Tuple[str, ...]:
    """``PROMPTED_BACKBONES``: the backbones that declare a system prompt, read from the registry when asked."""
    if name == "PROMPTED_BACKBONES":
        return registry.prompted_backbones()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check(text) -> str:
    """``text`` when it is an acceptable system prompt, else ValueError with one clear line."""
    if not isinstance(text, str):
        raise ValueError(f"the system prompt must be text, got {type(text).__name__}")
    if not text.strip():
        raise ValueError("the system prompt is empty; give some text (or use the backbone's default)")
    if len(text) > MAX_CHARS:
        raise ValueError(f"the system prompt is {len(text):,} characters long; at most {MAX_CHARS:,} are allowed")
    for i, c in enumerate(text):
        if c not in ALLOWED_CONTROLS and unicodedata.category(c) in ("Cc", "Cs"):
            raise ValueError(f"the system prompt holds a control character (U+{ord(c):04X}) at character {i + 1}; "
                             "only text, newlines and tabs are allowed")
    return text
