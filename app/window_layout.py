"""The main window's layout (a mixin of :class:`app.window.MainWindow`): the widgets and where they go.

Top: Start, Stop, the state, the session and Export. Left: the side panels (model, system prompt, audio,
conversation, engine optimizations, engine), scrolling, above the event log and the stage statistics, which stay
in view. Right: the banners above the plots (per-second work, the summary and conversation badges, sound and
spectrogram, state memory), which scroll in a window shorter than :data:`PLOTS_MIN_HEIGHT` rather than squash the
timing plot, with the sound plots stacked when narrow; the transcript beside them. 900 × 600 is the smallest
window.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QSplitter, QTabWidget,
                               QVBoxLayout, QWidget)

from app import controller as ctl
from app import theme
from app.banners import BannerStack
from app.dashboard import ScopePlot, SpectrogramPlot, StatsPanel
from app.engine_panel import EnginePanel
from app.panels import DevicePanel, EventLogPanel, ModelPanel, SummaryRow, TogglePanel
from app.plots import MemoryPlot, TimingPlot
from app.prompt_panel import SystemPromptPanel
from app.readouts import ConversationPanel, ReadoutRow
from app.transcript import TranscriptView
from app.viewmodel import YELLOW
from app.window_actions import KEYS

SYNTHETIC_BANNER = ("Synthetic weights: timing and memory are real; the voice is not speech — "
                    "load a checkpoint folder for a real voice.")
#: the window's size when it opens, and the smallest it may be made (px)
DEFAULT_SIZE, MIN_SIZE = (1440, 920), (900, 600)
#: the plots' column never shrinks below this (px): a shorter window scrolls it (the timing plot keeps ~250 px)
PLOTS_MIN_HEIGHT = 700
#: plots narrower than this (px) stack the sound view above the spectrogram (their titles stay whole)
SOUND_SIDE_BY_SIDE_PX = 640
#: the height the stacked sound plots add to the plots' column (px)
STACKED_EXTRA_PX = 180


def _scroll(widget: QWidget, horizontal: bool = True) -> QScrollArea:
    """``widget`` in a frameless scroll area that resizes it (vertical scrolling only without ``horizontal``)."""
    area = QScrollArea()
    area.setWidget(widget)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.NoFrame)
    if not horizontal:
        area.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    return area


class WindowLayout:
    """Builds the window's widgets (``_build``) and keeps the sound plots' arrangement to the plots' width."""

    def _build(self) -> None:
        self.start_button = QPushButton("Start")
        self.stop_button = QPushButton("Stop")
        self.export_button = QPushButton("Export…")
        self.start_button.setToolTip(f"build the model and start listening ({KEYS['start']})")
        self.stop_button.setToolTip(f"stop the session after the second in progress ({KEYS['stop']})")
        self.export_button.setToolTip("timing logs (CSV, JSON Lines, Perfetto trace) and input/output WAV "
                                      f"({KEYS['export']})")
        self.stop_button.setEnabled(False)
        self.export_button.setEnabled(False)
        self.state_label = QLabel()
        self.session_label = theme.dim(QLabel("no session"))
        self.session_label.setWordWrap(True)
        self.backlog_label = QLabel("")
        top = QHBoxLayout()
        for w in (self.start_button, self.stop_button, self.state_label):
            top.addWidget(w)
        top.addWidget(self.session_label, 1)
        top.addWidget(self.backlog_label)
        top.addWidget(self.export_button)

        self.model_panel = ModelPanel(self.cuda)
        self.prompt_panel = SystemPromptPanel(self.model_panel.backbone, self.controller)   # follows the backbone
        self.device_panel = DevicePanel()
        self.toggle_panel = TogglePanel(self.cuda)
        self.engine_panel = EnginePanel(self.qsettings, self.controller)   # embedded | remote server (engine/serve)

        self.timing_plot = TimingPlot()
        self.memory_plot = MemoryPlot()
        self.scope = ScopePlot(self.controller.monitor)
        self.stats = StatsPanel()
        self.summary_row = SummaryRow()
        self.events = EventLogPanel(self.log)
        self.transcript = TranscriptView()
        self.readouts = ReadoutRow()
        self.spectrogram = SpectrogramPlot(self.controller.monitor)
        self.conversation = ConversationPanel()
        tabs = QTabWidget()
        tabs.addTab(self.events, "Events")
        tabs.addTab(self.stats, "Stage statistics")
        self.tabs = tabs
        left = QWidget()
        lcol = QVBoxLayout(left)
        lcol.setContentsMargins(0, 0, 0, 0)
        for w in (self.model_panel, self.prompt_panel, self.device_panel, self.conversation, self.toggle_panel,
                  self.engine_panel):
            lcol.addWidget(w)
        lcol.addStretch(1)
        plots = QWidget()
        plots.setMinimumHeight(PLOTS_MIN_HEIGHT)      # a short window scrolls the plots rather than squash them
        rcol = QVBoxLayout(plots)
        rcol.setContentsMargins(0, 0, 0, 0)
        self.banners = BannerStack()             # above the plots, outside their scroll: a banner never covers one
        rcol.addWidget(self.timing_plot, 3)
        rcol.addWidget(self.summary_row)
        rcol.addWidget(self.readouts)
        self.sound = QSplitter(Qt.Horizontal)     # side by side; stacked when the plots are narrow
        self.sound.addWidget(self.scope)
        self.sound.addWidget(self.spectrogram)
        rcol.addWidget(self.sound, 2)
        rcol.addWidget(self.memory_plot, 2)
        self.plots = plots
        self.plots_scroll = _scroll(plots, horizontal=False)
        self.plots_scroll.installEventFilter(self)    # its width picks the sound plots' arrangement
        column = QWidget()
        ccol = QVBoxLayout(column)
        ccol.setContentsMargins(0, 0, 0, 0)
        ccol.addWidget(self.banners)
        ccol.addWidget(self.plots_scroll, 1)
        right = QSplitter(Qt.Horizontal)          # the transcript scrolls beside the plots
        right.addWidget(column)
        said = QWidget()
        scol = QVBoxLayout(said)
        scol.setContentsMargins(0, 0, 0, 0)
        head = QLabel("<b>Transcript</b> (the model's text per second · your speech)")
        head.setWordWrap(True)
        scol.addWidget(head)
        scol.addWidget(self.transcript, 1)
        right.addWidget(said)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 1)
        right.setSizes([760, 260])
        self.synthetic_banner = self.banners.add(YELLOW)
        self.synthetic_banner.setText(SYNTHETIC_BANNER)
        self.keepup_banner = self.banners.add("#f9c784")
        self.message_banner = self.banners.add("#f4b6b2")

        scroll = _scroll(left)                   # the side panels scroll rather than hold the window large
        side = QSplitter(Qt.Vertical)             # the event log below them, in view without scrolling
        side.addWidget(scroll)
        side.addWidget(tabs)
        side.setStretchFactor(0, 3)
        side.setStretchFactor(1, 2)
        side.setSizes([520, 330])
        side.setChildrenCollapsible(False)
        side.setMinimumWidth(left.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width())
        split = QSplitter(Qt.Horizontal)
        split.addWidget(side)
        split.addWidget(right)
        split.setStretchFactor(0, 1)               # a narrower window takes from both sides
        split.setStretchFactor(1, 3)
        split.setSizes([430, 1010])
        central = QWidget()
        col = QVBoxLayout(central)
        col.addLayout(top)
        col.addWidget(split, 1)
        self.setCentralWidget(central)
        self._build_menus()
        self._build_help_menu()
        self._show_state(ctl.IDLE)

    def eventFilter(self, obj, event) -> bool:
        if obj is getattr(self, "plots_scroll", None) and event.type() == QEvent.Resize:
            self._arrange_sound(event.size().width())
        return super().eventFilter(obj, event)

    def _arrange_sound(self, width: int) -> None:
        """The sound view and the spectrogram side by side in wide plots, stacked (and scrolled) in narrow ones."""
        wide = width >= SOUND_SIDE_BY_SIDE_PX
        orientation = Qt.Horizontal if wide else Qt.Vertical
        if self.sound.orientation() != orientation:
            self.sound.setOrientation(orientation)
            self.plots.setMinimumHeight(PLOTS_MIN_HEIGHT + (0 if wide else STACKED_EXTRA_PX))
