"""The System prompt panel: the text a MiniCPM-o 4.5 session starts from, shown and editable.

It follows the Model panel's backbone choice: for a backbone that takes a system prompt
(``engine.system_prompt.takes_prompt``) it shows a multi-line field holding the prompt the next session
starts with — the backbone's default (the MiniCPM-o demo's default duplex preset) until the user edits
it — with **Reset to default**; for any other backbone one line says it has none. A prompt applies when a
session starts, so the field is disabled while one runs. The text is checked by the engine's own rule
(``engine.system_prompt.check``: not blank, at most 4,000 characters, no control characters but newlines
and tabs) as it is typed; a bad one is named in red under the field and Start refuses it with the same
line, leaving the text as it is.
"""
from __future__ import annotations

from typing import Optional, Tuple

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout

from app import controller as ctl
from app import theme
from app.viewmodel import RED
from engine import system_prompt

#: the field's height, in lines of text
FIELD_LINES = 5
RUNNING_NOTE = "Fixed while a session runs: a system prompt applies when a session starts."


def default_prompt() -> str:
    """The default the field shows and resets to (the prompted backbone's: MiniCPM-o 4.5's)."""
    return system_prompt.default_for(system_prompt.PROMPTED_BACKBONES[0]) or ""


class SystemPromptPanel(QGroupBox):
    """The system prompt of the next session (for a backbone that takes one)."""

    changed = Signal()

    def __init__(self, backbone: QComboBox, controller, parent=None):
        """``backbone``: the Model panel's backbone picker (followed); ``controller``: its state disables
        the field while a session runs."""
        super().__init__("System prompt", parent)
        self.backbone = backbone
        self.edit = QPlainTextEdit()
        self.edit.setTabChangesFocus(True)             # Tab moves on; a tab character can still be pasted
        self.edit.setToolTip("the system prompt the next session starts with (it applies at Start)")
        lines = self.edit.fontMetrics().lineSpacing() * FIELD_LINES
        self.edit.setFixedHeight(lines + 2 * self.edit.frameWidth() + 8)
        self.reset_button = QPushButton("Reset to default")
        self.reset_button.setToolTip("the backbone's default (the MiniCPM-o demo's default duplex preset)")
        self.reset_button.clicked.connect(self.reset)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.note = theme.dim(QLabel())
        self.note.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.status, 1)
        row.addWidget(self.reset_button)
        lay = QVBoxLayout(self)
        lay.addWidget(self.edit)
        lay.addLayout(row)
        lay.addWidget(self.note)
        self._running = False
        self.edit.textChanged.connect(self._on_edit)
        backbone.currentIndexChanged.connect(lambda _: self._refresh())
        controller.state_changed.connect(self._on_state)
        self.set_text("")

    # -- values ------------------------------------------------------------------------------------
    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        """Show ``text``; "" shows the default."""
        self.edit.setPlainText(text or default_prompt())

    def saved_text(self) -> str:
        """What the settings keep: "" while the field holds the default (a later default then shows)."""
        return "" if self.text() == default_prompt() else self.text()

    def reset(self) -> None:
        self.set_text("")

    def value(self) -> Tuple[Optional[str], str]:
        """(the prompt for the session's config, "") — None for a backbone that takes none — or (None, the
        one line that says what is wrong with the text)."""
        if not system_prompt.takes_prompt(self.backbone.currentData()):
            return None, ""
        try:
            return system_prompt.check(self.text()), ""
        except ValueError as e:
            return None, str(e)[:1].upper() + str(e)[1:]       # the engine's line, as a sentence

    # -- display -----------------------------------------------------------------------------------
    def _on_edit(self) -> None:
        self._refresh()
        self.changed.emit()

    def _on_state(self, state: str) -> None:
        self._running = state != ctl.IDLE
        self._refresh()

    def _refresh(self) -> None:
        takes = system_prompt.takes_prompt(self.backbone.currentData())
        for w in (self.edit, self.reset_button, self.status):
            w.setVisible(takes)
            w.setEnabled(not self._running)
        self.note.setVisible(not takes or self._running)
        if not takes:
            self.note.setText(f"The {self.backbone.currentText()} backbone has no system prompt.")
            return
        self.note.setText(RUNNING_NOTE)
        _, err = self.value()
        n = len(self.text())
        mark = " (default)" if self.text() == default_prompt() else ""
        self.status.setText(err or f"{n:,} / {system_prompt.MAX_CHARS:,} characters{mark}")
        self.status.setStyleSheet(f"color: {RED};" if err else "")
