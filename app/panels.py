"""The window's side panels: model choice, audio devices, engine toggles, summary row, event log."""
from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import List, Optional, Tuple

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (QApplication, QButtonGroup, QCheckBox, QComboBox, QFileDialog, QFormLayout,
                               QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QRadioButton, QVBoxLayout, QWidget)

from app import theme
from app.badges import badge_grid, paint
from app.audio_io import DeviceInfo
from app.plots import LevelMeter
from app.viewmodel import GREEN, RED, YELLOW, EventLog, Summary
from engine import registry
from engine.session import SessionConfig
from engine.session.input_rate import default_input_rate

SIZES = [("auto", "auto"), ("released", "released"), ("tiny", "tiny")]
#: the mic label: open (every sound goes to the model), or muted until Space is held (push-to-talk)
MIC_OPEN, MIC_MUTED = "mic: open", "mic: muted (hold Space)"


def short_title(title: str) -> str:
    """A part's title as its picker shows it: without the parenthesis ("Step-Audio2 token2wav"); the whole
    title is the item's tooltip."""
    return title.split(" (", 1)[0]


def _model_combo(entries, tooltip: str) -> QComboBox:
    """A picker of registered parts: short titles shown whole, the full title as each item's tooltip."""
    c = _combo([(short_title(e.title), e.name) for e in entries], tooltip)
    for i, e in enumerate(entries):
        c.setItemData(i, e.title, Qt.ToolTipRole)
    return c


def _combo(items, tooltip: str = "") -> QComboBox:
    c = QComboBox()
    for text, data in items:
        c.addItem(text, data)
    c.setToolTip(tooltip)
    c.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)   # long names elide: the panel
    c.setMinimumContentsLength(14)                                            # may be narrow
    return c


def _select(combo: QComboBox, data) -> None:
    i = combo.findData(data)
    if i >= 0:
        combo.setCurrentIndex(i)


class PathChooser(QWidget):
    """A path line edit with a "Browse…" button (a folder, or a file matching ``files``) and a clear button."""

    changed = Signal(str)

    def __init__(self, placeholder: str, parent=None, files: Optional[str] = None):
        super().__init__(parent)
        self.files = files
        self.edit = QLineEdit()
        self.edit.setPlaceholderText(placeholder)
        self.edit.setClearButtonEnabled(True)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.edit, 1)
        lay.addWidget(browse)
        self.edit.editingFinished.connect(lambda: self.changed.emit(self.path()))
        self.edit.textChanged.connect(lambda t: self.changed.emit(self.path()) if not t else None)

    def path(self) -> str:
        return self.edit.text().strip()

    def set_path(self, path: str) -> None:
        self.edit.setText(path or "")
        self.changed.emit(self.path())

    def _browse(self) -> None:
        if self.files:
            path, _ = QFileDialog.getOpenFileName(self, "Choose a file", self.path(), self.files)
        else:
            path = QFileDialog.getExistingDirectory(self, "Choose a checkpoint folder", self.path())
        if path:
            self.set_path(path)


#: the longest a model-folder check may take before the panel gives its verdict (the engine's checks are
#: bounded to seconds; a folder on a stalled network mount is not)
CHECK_LIMIT_S = 10.0

CPU_RELEASED = ("⚠ released size on a CPU cannot keep up in real time: seconds queue up and the answer lags "
                "further behind — choose tiny, or run on a GPU")


class ModelPanel(QGroupBox):
    """Decoder tail, backbone, size and checkpoints, checked by the engine (``SessionConfig.resolved``,
    which reads the checkpoint's contents) on a worker thread: the panel shows "checking…", then
    the engine's one-line error or a tick, never a verdict of its own."""

    changed = Signal()
    _checked = Signal(int, object, str)     # generation, resolved config or None, error (worker -> GUI)

    def __init__(self, cuda: bool, parent=None):
        super().__init__("Model", parent)
        self.cuda = cuda
        self.tail = _model_combo(registry.tails(), "the decoder tail that turns speech tokens into audio")
        self.backbone = _model_combo(registry.backbones(), "the model that listens and decides what to say")
        self.size = _combo(SIZES, "auto picks released sizes on a GPU and tiny sizes on a CPU")
        self.checkpoint = PathChooser("none: seeded random weights")
        self.backbone_checkpoint = PathChooser("the backbone's weights folder (optional)")
        self.backbone_checkpoint.setToolTip(registry.folder_hints())
        self.voice = PathChooser("default: the backbone folder's voice, else synthetic",
                                 files="Voice (*.wav *.npz);;All files (*)")
        self.voice.setToolTip("; ".join(f"the {e.name} tail's voice: {e.conditioning.help}"
                                        for e in registry.tails() if e.conditioning is not None))
        self.size_note = theme.dim(QLabel(f"auto = {'released on this GPU' if cuda else 'tiny (no CUDA here)'}"))
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.generation = 0
        self.checking = False
        self._done = threading.Event()           # set when the check of the current generation answered
        self._verdict: Tuple[int, Optional[SessionConfig], str] = (-1, None, "")   # written by the worker
        self._checked.connect(self._on_checked)
        form = QFormLayout(self)
        form.addRow("Decoder tail", self.tail)
        form.addRow("Backbone", self.backbone)
        form.addRow("Size", self.size)
        form.addRow("", self.size_note)
        form.addRow("Tail checkpoint", self.checkpoint)
        form.addRow("Backbone weights", self.backbone_checkpoint)
        form.addRow("Voice", self.voice)
        form.addRow(self.status)
        for c in (self.tail, self.backbone, self.size):
            c.currentIndexChanged.connect(self._on_change)
        self.checkpoint.changed.connect(self._on_change)
        self.backbone_checkpoint.changed.connect(self._on_change)
        self.voice.changed.connect(self._on_change)
        self._on_change()

    def set_values(self, tail: str, backbone: str, size: str, checkpoint: str, backbone_checkpoint: str,
                   voice: str = "") -> None:
        _select(self.tail, tail)
        _select(self.backbone, backbone)
        _select(self.size, size)
        self.checkpoint.set_path(checkpoint)
        self.backbone_checkpoint.set_path(backbone_checkpoint)
        self.voice.set_path(voice)

    def config(self, **toggles) -> SessionConfig:
        """The unresolved config the panel shows (plus the given toggles); the input rate is the backbone's
        default (MiniCPM-o 4.5: 16 kHz, the stock's own front end; the others 24 kHz)."""
        toggles.setdefault("input_rate", default_input_rate(self.backbone.currentData()))
        return SessionConfig(tail=self.tail.currentData(), backbone=self.backbone.currentData(),
                             size=self.size.currentData(), checkpoint=self.checkpoint.path() or None,
                             backbone_checkpoint=self.backbone_checkpoint.path() or None,
                             voice=self.voice.path() or None, **toggles)

    def validate(self) -> Tuple[Optional[SessionConfig], str]:
        """(resolved config, "") when valid, else (None, the one clear message): the worker's verdict on
        what the panel shows, waited for at most CHECK_LIMIT_S (the GUI thread never reads the folders)."""
        gen, done = self.generation, self._done
        if not done.wait(CHECK_LIMIT_S):
            return None, self._too_slow()
        got, cfg, err = self._verdict
        if got != gen:
            return None, "the model choice changed while it was being checked; try again"
        return cfg, err

    @staticmethod
    def _too_slow() -> str:
        return (f"checking the model folders took longer than {CHECK_LIMIT_S:.0f} s (a stalled or very slow "
                f"disk?); choose another folder or try again")

    def _on_change(self, *_) -> None:
        self.backbone_checkpoint.setEnabled(self.backbone.currentData() in registry.folder_backbones())
        self.voice.setEnabled(self.tail.currentData() in registry.conditioned_tails())
        self.generation += 1
        self.checking = True
        self._done = threading.Event()
        self.status.setText("checking…")
        self.status.setStyleSheet("")
        gen, cfg = self.generation, self.config()
        threading.Thread(target=self._check, args=(gen, cfg, self._done), name="model-check", daemon=True).start()
        QTimer.singleShot(int(CHECK_LIMIT_S * 1000), lambda: self._check_timed_out(gen))

    def _check_timed_out(self, gen: int) -> None:
        """GUI thread: the check of ``gen`` has not answered within CHECK_LIMIT_S; its late answer is ignored."""
        if gen != self.generation or not self.checking:
            return
        self.generation += 1                     # whatever the stalled check says later is dropped
        self._verdict = (self.generation, None, self._too_slow())
        self._done = threading.Event()
        self._done.set()
        self._on_checked(self.generation, None, self._too_slow())

    def _check(self, gen: int, cfg: SessionConfig, done: threading.Event) -> None:
        """Worker thread: the engine's verdict on the folder (it may read the files)."""
        try:
            result = (cfg.resolved(), "")
        except ValueError as e:
            result = (None, str(e))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - an unexpected failure (even a native library's panic,
            result = (None, f"{type(e).__name__}: {' '.join(str(e).split())}")   # a BaseException) is one line
        if gen == self.generation:
            self._verdict = (gen, *result)
        done.set()
        try:
            self._checked.emit(gen, *result)
        except RuntimeError:
            pass                                 # the window closed meanwhile

    def _on_checked(self, gen: int, cfg: Optional[SessionConfig], err: str) -> None:
        if gen != self.generation:
            return                               # the panel changed since: a newer check is running
        self.checking = False
        if cfg is None:
            self.status.setText(f"✗ {err}")
            self.status.setStyleSheet(f"color: {RED};")
        else:
            self._show_ok(cfg)
        self.changed.emit()

    def _show_ok(self, cfg: SessionConfig) -> None:
        weights = "checkpoint weights" if cfg.checkpoint else "seeded random weights (no real voice)"
        text = f"✓ {cfg.size} on {cfg.device}, {weights}"
        if cfg.voice_origin:                     # a tail with a voice
            text += f"; voice: {Path(cfg.voice).name if cfg.voice else 'synthetic prompt'}"
        slow = cfg.size == "released" and cfg.device == "cpu"
        self.status.setText(f"{text}\n{CPU_RELEASED}" if slow else text)
        self.status.setStyleSheet(f"color: {YELLOW if slow else GREEN};")


class DevicePanel(QGroupBox):
    """Input/output pickers (with native rates), open mic vs push-to-talk, level meter, xruns."""

    input_changed = Signal()
    output_changed = Signal()
    push_to_talk_changed = Signal(bool)

    def __init__(self, parent=None):
        super().__init__("Audio", parent)
        self.input = QComboBox()
        self.output = QComboBox()
        self.input.setMinimumContentsLength(14)
        self.output.setMinimumContentsLength(14)
        self.input.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.output.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.open_mic = QRadioButton("Open mic")
        self.ptt = QRadioButton("Hold Space to talk")
        group = QButtonGroup(self)
        group.addButton(self.open_mic)
        group.addButton(self.ptt)
        self.open_mic.setChecked(True)
        self.meter = LevelMeter()
        self.out_meter = LevelMeter(tooltip="level of the model's speech playing now (dBFS)")
        self.mic_state = QLabel(MIC_OPEN)
        self.xruns = QLabel("xruns: 0")
        self.xruns.setToolTip("audio callback overflows and underflows, and blocks that found the input "
                              "buffer full")
        self.device_error = QLabel()
        self.device_error.setWordWrap(True)
        self.device_error.setStyleSheet(f"color: {RED};")
        self.device_error.hide()
        modes = QHBoxLayout()
        modes.addWidget(self.open_mic)
        modes.addWidget(self.ptt)
        modes.addStretch(1)
        stats = QHBoxLayout()
        stats.addWidget(self.mic_state)
        stats.addStretch(1)
        stats.addWidget(self.xruns)
        form = QFormLayout(self)
        form.addRow("Input", self.input)
        form.addRow("Output", self.output)
        form.addRow("Mic", modes)
        form.addRow("Mic level", self.meter)
        form.addRow("Out level", self.out_meter)
        form.addRow(stats)
        form.addRow(self.device_error)
        self.input.activated.connect(self._on_input)
        self.output.activated.connect(lambda _: self.output_changed.emit())
        self.ptt.toggled.connect(self.push_to_talk_changed.emit)
        self.ptt.toggled.connect(lambda _: self.show_mic_idle())

    def populate(self, inputs: List[DeviceInfo], outputs: List[DeviceInfo], error: str = "",
                 input_file: str = "") -> None:
        """Fill the pickers; ``error`` (PortAudio missing, no devices) is shown in red."""
        self.input.clear()
        self.output.clear()
        for d in inputs:
            self.input.addItem(f"{d.label}", ("device", d))
        if input_file:
            self.add_input_file(input_file, select=False)
        self.input.addItem("WAV file…", ("choose", None))
        for d in outputs:
            self.output.addItem(f"{d.label}", ("device", d))
        self.output.addItem("No playback (record only)", ("none", None))
        self.device_error.setText(error)
        self.device_error.setVisible(bool(error))

    def add_input_file(self, path: str, select: bool = True) -> None:
        i = self.input.findData(("file", path))
        if i < 0:
            i = max(0, self.input.count() - 1) if self.input.findData(("choose", None)) >= 0 else self.input.count()
            self.input.insertItem(i, f"WAV: {path}", ("file", path))
        if select:
            self.input.setCurrentIndex(i)

    def select_device(self, combo: QComboBox, name: str) -> None:
        for i in range(combo.count()):
            kind, d = combo.itemData(i)
            if kind == "device" and d.name == name:
                combo.setCurrentIndex(i)
                return

    def selected_input(self) -> Tuple[str, object]:
        return self.input.currentData() or ("choose", None)

    def selected_output(self) -> Tuple[str, object]:
        return self.output.currentData() or ("none", None)

    def _on_input(self, index: int) -> None:
        kind, _ = self.input.itemData(index)
        if kind == "choose":
            path, _ = QFileDialog.getOpenFileName(self, "Play a WAV file as the microphone", "", "WAV (*.wav)")
            if path:
                self.add_input_file(path)
            else:
                self.input.setCurrentIndex(0)
        self.input_changed.emit()

    def show_output(self, device_name: Optional[str], label: str = "") -> None:
        """Make the Output picker show ``device_name``, or "No playback" for None; ``label``: a sink that is
        no device (a scripted run's simulated speaker) is shown by its label."""
        if label:
            i = self.output.findText(label)
            if i < 0:
                self.output.insertItem(0, label, ("sim", None))
                i = 0
            self.output.setCurrentIndex(i)
            return
        if device_name is not None:
            self.select_device(self.output, device_name)
            return
        i = self.output.findData(("none", None))
        if i >= 0:
            self.output.setCurrentIndex(i)

    def show_mic_idle(self) -> None:
        """No session: the mic label says what the chosen mode will do (push-to-talk: muted until Space)."""
        self.mic_state.setText(MIC_MUTED if self.ptt.isChecked() else MIC_OPEN)

    def show_meters(self, m: dict) -> None:
        self.meter.set_level(m.get("level_db", -120.0))
        out = m.get("output_db")
        if out is None:
            self.out_meter.set_idle("no playback")
        else:
            self.out_meter.set_level(out)
        self.mic_state.setText(MIC_OPEN if m.get("mic_open", True) else MIC_MUTED)
        self.xruns.setText(f"xruns: {m.get('xruns', 0)}")


class TogglePanel(QGroupBox):
    """The engine's optimizations; changes apply at the next second boundary."""

    toggled = Signal(bool, bool)     # demand_sized, graph_replay

    def __init__(self, cuda: bool, parent=None):
        super().__init__("Engine optimizations", parent)
        self.demand = QCheckBox("Demand-sized state (exact per-second lengths)")
        self.graphs = QCheckBox("Exact-shape graph replay (CUDA graphs)")
        self.demand.setChecked(True)
        self.graphs.setChecked(cuda)
        self.demand.setToolTip("state regions sized to what each second needs instead of the stock maxima")
        if cuda:
            self.graphs.setToolTip("replay one captured CUDA graph per exact shape signature")
        else:
            self.graphs.setEnabled(False)
            self.graphs.setToolTip("needs CUDA: there is no GPU here, so every second runs eagerly")
        note = theme.dim(QLabel("Applied at the next second boundary; no audio is dropped and output bits never "
                                "change."))
        note.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.addWidget(self.demand)
        lay.addWidget(self.graphs)
        lay.addWidget(note)
        self.demand.toggled.connect(self._emit)
        self.graphs.toggled.connect(self._emit)

    def values(self) -> Tuple[bool, bool]:
        return self.demand.isChecked(), self.graphs.isChecked() and self.graphs.isEnabled()

    def _emit(self, *_) -> None:
        self.toggled.emit(*self.values())


class SummaryRow(QWidget):
    """p50 / p99 of the last 60 s, misses, current lateness, backlog, mic-to-speaker delay, state
    bytes; coloured (grey and "—" before any data)."""

    KEYS = ("p50", "p99", "misses", "lateness", "backlog", "delay", "memory")
    TIPS = {"p50": "median work per second over the last 60 s", "p99": "99th percentile over the last 60 s",
            "misses": "seconds that missed their deadline (whole session, and in the last 60 s)",
            "lateness": "how late the latest second finished", "backlog": "input seconds waiting for the engine",
            "delay": "mic→speaker: from the end of an input second to the moment its answer starts playing "
                     "(speech at the start of a second waits up to 1 s more for the second to fill)",
            "memory": "the engine's state arenas now"}

    def __init__(self, parent=None):
        super().__init__(parent)
        self.labels = badge_grid(self, self.KEYS, self.TIPS, 4)     # two rows: the row fits a narrow window
        self.show_summary(Summary())

    def show_summary(self, s: Summary) -> None:
        texts = s.text()
        for k, lab in self.labels.items():
            paint(lab, texts[k], s.colours.get(k, "#8a8f98"), bold=True)


def _shape(text: str) -> str:
    """A line's shape: its text with the numbers taken out (repeated lines of one shape collapse)."""
    return re.sub(r"[-+]?\d[\d.,]*", "#", text)


class EventLogPanel(QWidget):
    """Timestamped events with "Copy as JSON"; filtered by kind, repeated lines collapsed ("×14")."""

    ALL = "all kinds"

    def __init__(self, log: EventLog, parent=None):
        super().__init__(parent)
        self.log = log
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(2000)
        self.view.setLineWrapMode(QPlainTextEdit.WidgetWidth)
        self.kinds = QComboBox()
        self.kinds.addItem(self.ALL, "")
        self.kinds.setToolTip("show the events of one kind")
        self.kinds.currentIndexChanged.connect(lambda _: self._redraw())
        self.entries: List[list] = []            # [kind, shape, count, line] per shown line (collapsed)
        copy = QPushButton("Copy as JSON")
        copy.clicked.connect(self.copy_json)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addWidget(self.view, 1)
        row = QHBoxLayout()
        row.addWidget(QLabel("Show"))
        row.addWidget(self.kinds)
        row.addStretch(1)
        row.addWidget(copy)
        lay.addLayout(row)

    def add(self, kind: str, text: str, data: Optional[dict] = None) -> None:
        ev = self.log.add(kind, text, data)
        if self.kinds.findData(kind) < 0:
            self.kinds.addItem(kind, kind)
        shape = _shape(text)
        last = self.entries[-1] if self.entries else None
        if last is not None and last[0] == kind and last[1] == shape:
            last[2] += 1
            last[3] = f"{ev.line()}  ×{last[2]}"
            if self._shown(kind):
                self._replace_last(last[3])
            return
        self.entries.append([kind, shape, 1, ev.line()])
        del self.entries[:-2000]
        if self._shown(kind):
            self.view.appendPlainText(ev.line())

    def collapse_reset(self) -> None:
        """A new session: its first repeated line starts a new count."""
        if self.entries:
            self.entries[-1][1] = None

    def _shown(self, kind: str) -> bool:
        want = self.kinds.currentData()
        return not want or want == kind

    def _replace_last(self, line: str) -> None:
        cursor = self.view.textCursor()
        cursor.movePosition(QTextCursor.End)
        cursor.select(QTextCursor.BlockUnderCursor if self.view.blockCount() > 1 else QTextCursor.Document)
        cursor.removeSelectedText()
        self.view.appendPlainText(line)

    def _redraw(self) -> None:
        self.view.setPlainText("\n".join(e[3] for e in self.entries if self._shown(e[0])))

    def text_lines(self) -> List[str]:
        return self.view.toPlainText().splitlines()

    def copy_json(self) -> str:
        text = self.log.to_json()
        QApplication.clipboard().setText(text)
        return text
