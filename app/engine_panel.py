"""The Engine setting: run sessions embedded (in this process) or on a `duplexcadence serve` server.

:class:`EnginePanel` sits with the other side panels. It wraps the controller's runner factory:
embedded sessions use the factory the controller came with (:class:`engine.session.LiveRunner`),
remote ones a :class:`engine.serve.client.RemoteRunner` for the URL and token shown here. The
choice is checked when the panels' Start is pressed (:meth:`prepare`) and applies to that session
only: scripted runs and tests, which start sessions directly, stay embedded.

The URL and the token file are remembered (QSettings keys ``engine/…``); a token typed into the
panel is not. If the server goes away mid-session the controller shows the error and the session's
journal keeps every second; this panel then offers **Reconnect** (a new session on the server).
"""
from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import QSettings, Signal
from PySide6.QtWidgets import (QButtonGroup, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QRadioButton, QWidget)

from app import theme
from engine.serve.auth import ENV, TokenError, read_token
from engine.serve.client import RemoteRunner
from engine.serve.protocol import session_url
from engine.session import SessionConfig

KEYS = {"mode": "engine/mode", "url": "engine/url", "token_file": "engine/token_file"}
EMBEDDED, REMOTE = "embedded", "remote"


def gui_words(message: str) -> str:
    """A command-line message for a GUI user: flags become the panel's fields."""
    message = message.replace(f"(give --token-file FILE or set {ENV})",
                              "(choose the server's token file with Browse…, or paste the token)")
    return message.replace("--token-file FILE", "a token file (Browse…)").replace("--token-file", "the token file")


class EnginePanel(QGroupBox):
    """Embedded | remote URL + token; makes the runners of sessions started from the panels."""

    reconnect = Signal()          # the user asks for a new session on the server after a loss

    def __init__(self, settings: QSettings, controller, parent=None):
        super().__init__("Engine", parent)
        self.settings = settings
        self.controller = controller
        self._embedded_factory: Callable = controller._factory
        controller._factory = self.runner_factory
        self._next: Optional[tuple] = None         # (url, token) for the next session, set by prepare()
        self.last_remote: Optional[RemoteRunner] = None
        self._build()
        self._load()
        # saved on the user's edits only (loading writes nothing; scripted runs never change settings)
        self.remote.toggled.connect(self._save)
        self.url.editingFinished.connect(self._save)
        self.token_file.editingFinished.connect(self._save)
        controller.stopped.connect(self._on_stopped)
        controller.info.connect(self._on_info)

    # -- widgets ---------------------------------------------------------------------------------
    def _build(self) -> None:
        self.embedded = QRadioButton("Embedded (this computer)")
        self.remote = QRadioButton("Remote server")
        group = QButtonGroup(self)
        for b in (self.embedded, self.remote):
            group.addButton(b)
        self.url = QLineEdit()
        self.url.setPlaceholderText("ws://HOST:8765")
        self.token_file = QLineEdit()
        self.token_file.setPlaceholderText(f"token file (else ${ENV})")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.Password)
        self.token.setPlaceholderText("or paste the token (not saved)")
        files = QWidget()
        row = QHBoxLayout(files)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.token_file, 1)
        row.addWidget(browse)
        self.note = theme.dim(QLabel("The server's model size, device and weights are used; decoder tail and "
                                     "backbone must be the ones it serves."))
        self.note.setWordWrap(True)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.reconnect_button = QPushButton("Reconnect")
        self.reconnect_button.setToolTip("start a new session on the server (the lost one stays in its journal)")
        self.reconnect_button.clicked.connect(self.reconnect.emit)
        self.reconnect_button.hide()
        form = QFormLayout(self)
        modes = QWidget()
        mrow = QHBoxLayout(modes)
        mrow.setContentsMargins(0, 0, 0, 0)
        mrow.addWidget(self.embedded)
        mrow.addWidget(self.remote)
        form.addRow(modes)
        form.addRow("URL", self.url)
        form.addRow("Token", files)
        form.addRow("", self.token)
        form.addRow(self.note)
        form.addRow(self.status)
        form.addRow(self.reconnect_button)
        self.remote.toggled.connect(self._on_mode)

    def _load(self) -> None:
        s = self.settings
        self.url.setText(str(s.value(KEYS["url"], "") or ""))
        self.token_file.setText(str(s.value(KEYS["token_file"], "") or ""))
        remote = str(s.value(KEYS["mode"], EMBEDDED) or EMBEDDED) == REMOTE
        (self.remote if remote else self.embedded).setChecked(True)
        self._on_mode(remote)

    def _save(self) -> None:
        if not getattr(self.window(), "persist_settings", True):
            return
        s = self.settings
        s.setValue(KEYS["mode"], REMOTE if self.remote.isChecked() else EMBEDDED)
        s.setValue(KEYS["url"], self.url.text().strip())
        s.setValue(KEYS["token_file"], self.token_file.text().strip())

    def _on_mode(self, remote: bool) -> None:
        for w in (self.url, self.token_file, self.token, self.note):
            w.setEnabled(bool(remote))

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose the server's token file", self.token_file.text())
        if path:
            self.token_file.setText(path)
            self._save()

    # -- sessions --------------------------------------------------------------------------------
    def prepare(self) -> Optional[str]:
        """Check the setting for a session started from the panels: None when it can start, else
        one message saying what is wrong (a URL that is not ws://HOST:PORT, no token)."""
        self._next = None
        self.reconnect_button.hide()
        if not self.remote.isChecked():
            return None
        try:
            session_url(self.url.text())
            token = self.token.text().strip() or read_token(self.token_file.text().strip() or None, role="client")
        except (ValueError, TokenError) as e:
            return f"Remote engine: {gui_words(str(e))}"
        self._next = (self.url.text().strip(), token)
        return None

    def runner_factory(self, cfg: SessionConfig):
        """The controller's factory: a remote runner after :meth:`prepare` chose one, else embedded."""
        nxt, self._next = self._next, None
        if nxt is None:
            return self._embedded_factory(cfg)
        # the server owns size, device and weights: ask only for what a client may choose; without CUDA
        # here the graph-replay switch is greyed out, so the server's default decides it
        leave = () if getattr(self.window(), "cuda", False) else ("graph_replay",)
        runner = RemoteRunner(cfg.replace(size="auto", device="auto", checkpoint=None, backbone_checkpoint=None),
                              *nxt, leave=leave)
        self.last_remote = runner
        self.status.setText(f"connecting to {runner.where}…")
        return runner

    def _on_info(self, info: dict) -> None:
        runner = self.last_remote
        if runner is not None and runner.session is not None:
            self.status.setText(f"session on {runner.where} (replica {runner.session.replica}, "
                                f"{info.get('device', '?')}, {info.get('size', '?')} size)")

    def _on_stopped(self) -> None:
        runner, self.last_remote = self.last_remote, None
        if runner is None:
            self.status.setText("")
            return
        if runner.lost is not None:
            self.status.setText(f"The server went away after {runner.lost.seconds} s; every second so far is kept "
                                "(Export… writes them). Reconnect starts a new session.")
            self.reconnect_button.show()
        elif runner.session is not None:
            self.status.setText(f"last session ran on {runner.where}")
        else:
            self.status.setText("")
