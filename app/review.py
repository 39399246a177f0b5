"""Replay and compare: exported sessions shown with the live window's plots, one or two side by side.

:class:`SessionView` shows one :class:`~app.replay.LoadedSession`: its summary chips, the timing
plot over the whole session (drag and wheel to browse), per-stage statistics with the histogram,
memory (with the card's size when the session ran on CUDA and recorded it) and the recorded microphone and
speech. :class:`CompareWindow` holds one view, or
two side by side with all their axes linked (timing, memory, recording, histogram) and a line saying
which side is slower and by how much (e.g. a stock-like run against an optimized one). Each view has its
whole-session chips, the audio-path readouts, the transcript, and a Play button for its recorded audio.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QMainWindow, QSplitter, QVBoxLayout, QWidget

from app import theme
from app.banners import BannerStack
from app.dashboard import MIC_COLOUR, SPEECH_COLOUR, StatsPanel
from app.panels import SummaryRow
from app.plots import MemoryPlot, TimingPlot
from app.readouts import ReadoutRow
from app.replay_audio import ReplayPlayer
from app.transcript import TranscriptView
from app.replay import LoadedSession, ReplayError, envelope, load_session
from app.viewmodel import SessionSeries

OPEN_KEYS = QKeySequence("Ctrl+O")
BESIDE_KEYS = QKeySequence("Ctrl+Shift+O")


class RecordingPlot(pg.PlotWidget):
    """The session's recorded microphone (top) and speech (bottom) as min/max envelopes."""

    def __init__(self, session: LoadedSession, parent=None):
        super().__init__(parent)
        self.setMinimumHeight(90)
        item = self.getPlotItem()
        item.setTitle("Recorded microphone (top) and the model's speech (bottom)", size="10pt")
        item.hideAxis("left")
        item.setLabel("bottom", "session second")
        item.setMenuEnabled(False)
        item.getViewBox().setMouseEnabled(y=False)
        self.curves = []
        for audio, colour, offset in ((session.input_audio, MIC_COLOUR, 0.0),
                                      (session.output_audio, SPEECH_COLOUR, -1.0)):
            t, lo, hi = envelope(audio)
            x, y = np.repeat(t, 2), np.column_stack([lo + offset, hi + offset]).reshape(-1)
            self.curves.append(item.plot(x, y, pen=pg.mkPen(colour, width=1), connect="pairs"))
        item.setYRange(-2.1, 1.1, padding=0)
        theme.apply_plot(self)


class SessionView(QWidget):
    """One replayed session with the same plots as the live window."""

    def __init__(self, session: LoadedSession, parent=None):
        super().__init__(parent)
        self.session = session
        self.series = SessionSeries()
        for row in session.rows:
            self.series.add(row)
        n = len(self.series)
        self.title = QLabel(f"<b>{session.title}</b>")
        self.title.setWordWrap(True)
        self.title.setToolTip(str(session.folder))
        self.summary_row = SummaryRow()
        self.summary_row.show_summary(self.series.whole_summary())
        self.readouts = ReadoutRow()
        self.readouts.show_row(self.series.rows[-1] if n else None, rows=self.series.rows)
        self.transcript = TranscriptView()
        self.transcript.show_rows(self.series.rows)
        self.player = ReplayPlayer(session)
        self.timing_plot = TimingPlot(visible_s=max(1, n))
        self.timing_plot.getPlotItem().getViewBox().setMouseEnabled(x=True, y=False)
        self.timing_plot.update_from(self.series)
        self.stats = StatsPanel()
        self.stats.show_stats(self.series, note=f"over all {n} s of the session")
        self.memory_plot = MemoryPlot()
        self.memory_plot.visible_s = max(1, n)
        self.memory_plot.set_info(session.info)           # the card line when the session recorded its size
        self.memory_plot.update_from(self.series)
        self.recording = RecordingPlot(session)
        self.cursor = pg.InfiniteLine(pos=0.0, angle=90, pen=pg.mkPen("#e17c05", width=1.5))
        self.recording.getPlotItem().addItem(self.cursor)
        self.cursor.hide()
        self.player.position.connect(self._at)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.player)
        lay.addLayout(head)
        lay.addWidget(self.summary_row)
        lay.addWidget(self.readouts)
        lay.addWidget(self.timing_plot, 3)
        lay.addWidget(self.stats, 2)
        lay.addWidget(self.memory_plot, 1)
        lay.addWidget(self.recording, 1)
        lay.addWidget(QLabel("<b>Transcript</b>"))
        lay.addWidget(self.transcript, 1)

    def _at(self, seconds: float) -> None:
        """The playing position, marked on the recording (hidden when playback stops)."""
        self.cursor.setVisible(seconds >= 0)
        self.cursor.setValue(max(0.0, seconds))


def slower_text(a_ms: float, b_ms: float) -> str:
    """Which side is slower, by how much: "B (right) is 1.68x slower" / "A (left) is …" / "the same"."""
    if a_ms <= 0 or b_ms <= 0:
        return "no ratio (a side has no time)"
    if abs(b_ms - a_ms) < 1e-9 * max(a_ms, b_ms) or round(max(a_ms, b_ms) / min(a_ms, b_ms), 2) == 1.0:
        return "A and B take the same time"
    side = "B (right)" if b_ms > a_ms else "A (left)"
    return f"{side} is {max(a_ms, b_ms) / min(a_ms, b_ms):.2f}x slower"


def compare_line(a: SessionSeries, b: SessionSeries) -> str:
    """Totals of two sessions side by side (A left, B right): p50/p99, misses, and which side is slower."""
    sa, sb = a.stage_stats(), b.stage_stats()
    miss = lambda s: int(s.missed().sum())          # noqa: E731
    return (f"total p50 A {sa.p50['total']:.0f} ms vs B {sb.p50['total']:.0f} ms: "
            f"{slower_text(sa.p50['total'], sb.p50['total'])}; p99 A {sa.p99['total']:.0f} vs "
            f"B {sb.p99['total']:.0f} ms; misses A {miss(a)} of {len(a)} s vs B {miss(b)} of {len(b)} s")


class CompareWindow(QMainWindow):
    """Exported sessions, one or two side by side (File → Open session…, Open beside…)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("DuplexCadence — session replay")
        self.views: List[SessionView] = []
        self.split = QSplitter()
        self.comparison = QLabel("")
        self.comparison.setWordWrap(True)
        central = QWidget()
        col = QVBoxLayout(central)
        col.addWidget(self.comparison)
        col.addWidget(self.split, 1)
        self.setCentralWidget(central)
        self.banners = BannerStack()              # in the layout: an error line never covers a view
        col.insertWidget(0, self.banners)
        self.error_banner = self.banners.add("#f4b6b2")
        menu = self.menuBar().addMenu("&File")
        self.open_action = QAction("Open session…", self, shortcut=OPEN_KEYS, triggered=self.open_dialog)
        self.beside_action = QAction("Open beside…", self, shortcut=BESIDE_KEYS,
                                     triggered=lambda: self.open_dialog(beside=True))
        for a in (self.open_action, self.beside_action):
            a.setToolTip(f"{a.text()} ({a.shortcut().toString(QKeySequence.NativeText)})")
            menu.addAction(a)
        menu.addAction(QAction("Close", self, shortcut=QKeySequence.Close, triggered=self.close))
        self.comparison.hide()
        self.resize(1200, 860)

    def open_dialog(self, beside: bool = False) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open an exported session folder")
        if folder:
            self.open_folder(folder, beside=beside)

    def open_folder(self, folder, beside: bool = False) -> Optional[SessionView]:
        """Show the session in ``folder`` (beside the one shown, or instead of all); an unreadable
        folder shows one error line and changes nothing."""
        try:
            session = load_session(folder)
        except ReplayError as e:
            self.error_banner.setText(str(e))
            self.error_banner.show()
            return None
        self.error_banner.hide()
        if not beside:
            for v in self.views:
                v.setParent(None)
                v.deleteLater()
            self.views = []
        elif len(self.views) >= 2:                 # two at most: the newer replaces the right one
            old = self.views.pop()
            old.setParent(None)
            old.deleteLater()
        view = SessionView(session)
        self.views.append(view)
        self.split.addWidget(view)
        self._link()
        self.setWindowTitle("DuplexCadence — " + " | ".join(Path(v.session.folder).name for v in self.views))
        return view

    def _link(self) -> None:
        """Two sessions share their axes so their bars compare by eye; a line compares their totals."""
        if len(self.views) < 2:
            self.comparison.hide()
            return
        a, b = self.views
        top = max(a.timing_plot.getPlotItem().viewRange()[1][1], b.timing_plot.getPlotItem().viewRange()[1][1])
        for v in (a, b):
            v.timing_plot.getPlotItem().setYRange(0, top, padding=0)
        top = max(a.memory_plot.top_mib, b.memory_plot.top_mib)       # in MiB: one unit for both sides
        for v in (a, b):
            v.memory_plot.update_from(v.series, min_top_mib=top)
        for name in ("timing_plot", "memory_plot", "recording"):       # every axis: one scale for both
            pa, pb = getattr(a, name).getPlotItem(), getattr(b, name).getPlotItem()
            pb.setXLink(pa)
            pb.setYLink(pa)
        ha, hb = a.stats.histogram.getPlotItem(), b.stats.histogram.getPlotItem()
        hb.setXLink(ha)
        hb.setYLink(ha)
        top = max(ha.viewRange()[1][1], hb.viewRange()[1][1])
        ha.setYRange(0, top, padding=0)
        self.comparison.setText(compare_line(a.series, b.series))
        self.comparison.show()
