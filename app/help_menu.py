"""The Help menu: the keyboard shortcuts, what the plots show, and About (the app's and its parts' versions).

Each entry opens a message box whose text comes from a function here (tests read the texts without a dialog).
"""
from __future__ import annotations

import platform
from importlib import metadata
from typing import Dict, List, Tuple

from PySide6.QtCore import qVersion
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMessageBox

from app.window_actions import KEYS

#: what each shortcut does (the keys themselves are app/window_actions.py KEYS)
SHORTCUTS = (("start", "start a session (build the model, then listen)"),
             ("stop", "stop the session after the second in progress"),
             ("export", "export the session: timing logs, Perfetto trace, WAVs, transcript"),
             ("open", "open an exported session (replay)"),
             ("beside", "open a second exported session beside it, to compare"))

PLOTS = (
    ("Per-second work", "each second's LISTEN (the microphone encoded), THINK (the backbone) and SPEAK (the decoder "
                        "tail) as stacked bars against the 1 s deadline (dashed red). A missed second is outlined "
                        "in red; pale green SPEAK is a listening second (the tail runs on silence); orange lines "
                        "mark where a toggle or control took effect."),
    ("Summary badges", "p50 and p99 of the last 60 s, misses, how late the latest second was, the input backlog, "
                       "the mic→speaker delay and the engine's state memory: green, yellow or red."),
    ("Conversation badges", "barge-in latency (your first word to the model falling silent), playback gaps, echo "
                            "suppression while the model speaks, and speech or input dropped to keep the delay "
                            "bounded."),
    ("Sound", "the last seconds of the microphone (top, as the engine hears it) and the model's speech (bottom, "
              "where it plays): the gap between your turn and its answer is the delay you hear."),
    ("Spectrogram", "the same two signals, 0-8 kHz: the model's own voice left in the microphone shows as the "
                    "same pattern above and below."),
    ("State memory", "the engine's state arenas and the allocator's reserved bytes per second; on a GPU the card's "
                     "total (and the process cap) as lines."),
    ("Events", "timestamped events (toggles, barge-ins, late seconds, devices); Copy as JSON puts them on the "
               "clipboard. Stage statistics: p50/p99 per stage and a histogram of each second's total."),
)


def shortcuts_text() -> str:
    rows = [f"{KEYS[k]} — {what}" for k, what in SHORTCUTS]
    rows += ["Space — hold to talk (with “Hold Space to talk” chosen)",
             "F1 — these shortcuts", "Ctrl+Q — quit"]
    return "\n".join(rows)


def plots_text() -> str:
    return "\n\n".join(f"{name}: {what}" for name, what in PLOTS)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions() -> List[Tuple[str, str]]:
    """(part, version) of the app and what it runs on."""
    import numpy
    import PySide6
    import pyqtgraph
    import torch
    cuda = f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (CPU)"
    return [("DuplexCadence", _version("duplexcadence")), ("Python", platform.python_version()),
            ("Qt", qVersion()), ("PySide6", PySide6.__version__), ("PyTorch", torch.__version__ + cuda),
            ("NumPy", numpy.__version__), ("pyqtgraph", pyqtgraph.__version__),
            ("echo canceller (livekit)", _version("livekit")), ("system", f"{platform.system()} {platform.machine()}")]


def about_text() -> str:
    lines = ["DuplexCadence: live full-duplex conversation with a clock-aware engine.", ""]
    lines += [f"{part}: {version}" for part, version in versions()]
    return "\n".join(lines)


class HelpMenu:
    """Mixed into the main window: Help → Keyboard shortcuts, What the plots show, About DuplexCadence."""

    def _build_help_menu(self) -> Dict[str, QAction]:
        menu = self.menuBar().addMenu("&Help")
        entries = {"shortcuts": ("Keyboard shortcuts", "F1", shortcuts_text),
                   "plots": ("What the plots show", None, plots_text),
                   "about": ("About DuplexCadence", None, about_text)}
        self.help_actions = {}
        for key, (title, keys, text) in entries.items():
            a = QAction(title, self, triggered=lambda _=False, t=title, f=text: self.show_help(t, f()))
            if keys is not None:
                a.setShortcut(QKeySequence(keys))
            menu.addAction(a)
            self.help_actions[key] = a
        return self.help_actions

    def show_help(self, title: str, text: str) -> None:
        QMessageBox(QMessageBox.Information, title, text, parent=self).exec()
