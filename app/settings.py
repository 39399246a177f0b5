"""Settings remembered between runs (QSettings): model, system prompt, devices, toggles, folders, geometry.

``DUPLEXCADENCE_SETTINGS=/path/file.ini`` (or ``--settings``) keeps them in an INI file instead of
the platform store: tests and scripted demos use it so they never touch a user's settings.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

from PySide6.QtCore import QByteArray, QSettings

from engine import registry

ORG = APP = "DuplexCadence"


@dataclass
class AppSettings:
    """Everything the window remembers; field names are the QSettings keys."""
    tail: str = dataclasses.field(default_factory=registry.default_tail)
    backbone: str = dataclasses.field(default_factory=registry.default_backbone)
    size: str = "auto"
    checkpoint: str = ""
    backbone_checkpoint: str = ""
    voice: str = ""                  # the tail's voice file; "" = the backbone folder's default / synthetic
    system_prompt: str = ""          # minicpm-o-4.5's system prompt; "" = its default (app/prompt_panel.py)
    input_device: str = ""           # device name; "" = system default
    output_device: str = ""
    input_file: str = ""             # last WAV used as the microphone
    push_to_talk: bool = False
    demand_sized: bool = True
    graph_replay: bool = True
    echo_cancellation: bool = True   # the conversation's controls (app/readouts.py ConversationPanel)
    interrupt: str = "normal"
    playback_delay: float = 0.5
    export_dir: str = ""
    geometry: bytes = b""


def open_qsettings(path: Optional[str] = None) -> QSettings:
    """An INI file when ``path`` or $DUPLEXCADENCE_SETTINGS is given, else the platform store."""
    path = path or os.environ.get("DUPLEXCADENCE_SETTINGS")
    if path:
        return QSettings(str(path), QSettings.IniFormat)
    return QSettings(ORG, APP)


def _coerce(value, default):
    """QSettings hands back strings from INI files; convert to the default's type."""
    if isinstance(default, bool):
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
    if isinstance(default, float):
        return float(value)
    if isinstance(default, bytes):
        return bytes(value.data()) if isinstance(value, QByteArray) else bytes(value or b"")
    return str(value) if value is not None else default


def load_settings(qs: QSettings) -> AppSettings:
    s = AppSettings()
    for f in dataclasses.fields(AppSettings):
        if qs.contains(f.name):
            try:
                setattr(s, f.name, _coerce(qs.value(f.name), getattr(s, f.name)))
            except (TypeError, ValueError):
                pass                          # a damaged value keeps its default
    return s


def save_settings(qs: QSettings, s: AppSettings) -> None:
    for f in dataclasses.fields(AppSettings):
        v = getattr(s, f.name)
        qs.setValue(f.name, QByteArray(v) if isinstance(v, bytes) else v)
    qs.sync()
