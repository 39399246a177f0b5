"""Dashboard views beside the timing plot: the audio scope and the per-stage statistics.

:class:`ScopePlot` draws the last seconds of the microphone and of the model's speech as min/max
envelopes on one wall clock (the model's speech where it *plays*, so the gap between a turn and
its answer is the delay a person hears); it draws only the visible columns, on the GUI timer.
:class:`StatsPanel` shows LISTEN / THINK / SPEAK / total p50 and p99 and a histogram of the
second's total with the deadline marked; live sessions and replayed ones use it alike.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from app import theme
from app.monitor import AudioMonitor
from app.plots import STAGE_COLOURS
from app.viewmodel import RED, SessionSeries, StageStats

MIC_COLOUR, SPEECH_COLOUR = "#4c78a8", "#59a14f"


def _pairs(t: np.ndarray, lo: np.ndarray, hi: np.ndarray, offset: float) -> tuple:
    """x [2C], y [2C] for vertical segments lo..hi per column (drawn with connect="pairs")."""
    return np.repeat(t, 2), np.column_stack([lo + offset, hi + offset]).reshape(-1)


class ScopePlot(pg.PlotWidget):
    """Scrolling waveforms: microphone on top, the model's speech below, the last few seconds."""

    def __init__(self, monitor: Optional[AudioMonitor] = None, clock: Callable[[], float] = time.monotonic,
                 parent=None):
        super().__init__(parent)
        self.monitor = monitor
        self.clock = clock
        self.setMinimumHeight(90)
        self.setToolTip("The last seconds of the microphone (as the engine hears it, after the push-to-talk "
                        "gate)\nand of the model's speech, drawn where it plays: the gap between your turn and "
                        "its answer\nis the delay you hear.")
        item = self.getPlotItem()
        item.setTitle("Sound: mic (top), model (bottom)", size="10pt")
        item.setMenuEnabled(False)
        item.getViewBox().setMouseEnabled(x=False, y=False)
        item.hideAxis("left")
        item.setLabel("bottom", "seconds ago")
        item.setYRange(-2.1, 1.1, padding=0)
        self.mic = item.plot([], [], pen=pg.mkPen(MIC_COLOUR, width=1), connect="pairs")
        self.speech = item.plot([], [], pen=pg.mkPen(SPEECH_COLOUR, width=1), connect="pairs")
        theme.apply_plot(self)
        self.refresh()

    def refresh(self) -> None:
        """Redraw the visible window (call from the GUI timer)."""
        if self.monitor is None:
            return
        now = self.clock()
        for curve, env, offset in ((self.mic, self.monitor.mic, 0.0), (self.speech, self.monitor.speech, -1.0)):
            t, lo, hi = env.view(now)
            curve.setData(*_pairs(t, lo, hi, offset))
        span = self.monitor.mic.span_cols * self.monitor.mic.col_s
        self.getPlotItem().setXRange(-span, 0.0, padding=0)


class SpectrogramPlot(pg.PlotWidget):
    """Spectrograms of the last seconds: the microphone (as the engine hears it, echo-cancelled) above, the
    model's speech (as it played) below; 0-8 kHz each, numpy rfft of only the new hops (app/monitor.py)."""

    FLOOR_DB, TOP_DB = -100.0, -20.0

    def __init__(self, monitor: Optional[AudioMonitor] = None, parent=None):
        super().__init__(parent)
        self.monitor = monitor
        self.setMinimumHeight(110)
        self.setToolTip("Spectrograms of the last seconds: the microphone as the engine hears it (top, after echo "
                        "cancellation)\nand the model's speech as it played (bottom); 0-8 kHz each.")
        item = self.getPlotItem()
        item.setTitle("Spectrogram: mic (top), model (bottom)", size="10pt")
        item.setMenuEnabled(False)
        item.getViewBox().setMouseEnabled(x=False, y=False)
        item.setLabel("bottom", "seconds ago")
        item.setLabel("left", "kHz")
        item.getAxis("left").setTicks([[(0, "0"), (4, "4"), (8, "8|0"), (12, "4"), (16, "8")]])
        lut = pg.colormap.get("viridis").getLookupTable(nPts=256)
        self.images = []
        for _ in range(2):
            img = pg.ImageItem(axisOrder="row-major")
            img.setLookupTable(lut)
            item.addItem(img)
            self.images.append(img)
        item.addItem(pg.InfiniteLine(pos=8, angle=0, pen=pg.mkPen("#ffffff", width=1)))
        item.setYRange(0, 16, padding=0)
        theme.apply_plot(self)
        self.refresh()

    def draw(self, mic: np.ndarray, speech: np.ndarray, span_s: float) -> None:
        """Draw two [frames, bins] dB images over the last ``span_s`` seconds."""
        for img, spec, y0 in ((self.images[0], mic, 8.0), (self.images[1], speech, 0.0)):
            img.setImage(spec.T, levels=(self.FLOOR_DB, self.TOP_DB), autoLevels=False)
            img.setRect(-span_s, y0, span_s, 8.0)
        self.getPlotItem().setXRange(-span_s, 0.0, padding=0)

    def refresh(self) -> None:
        """Redraw from the monitor (call from the GUI timer; only new hops are transformed)."""
        if self.monitor is None:
            return
        mic, speech = self.monitor.spectra.images()
        self.draw(mic, speech, self.monitor.spectra.span_s)


class StatsPanel(QWidget):
    """p50 / p99 per stage and of the total, and a histogram of the second's total."""

    ROWS = ("listen", "think", "speak", "total")

    def __init__(self, parent=None):
        super().__init__(parent)
        grid = QGridLayout()
        grid.setContentsMargins(4, 2, 4, 2)
        self.cells = {}
        for c, head in enumerate(("", "p50", "p99")):
            grid.addWidget(QLabel(f"<b>{head}</b>"), 0, c, Qt.AlignRight)
        for r, name in enumerate(self.ROWS, start=1):
            label = QLabel(name.upper())
            if name in STAGE_COLOURS:
                label.setStyleSheet(f"color: {STAGE_COLOURS[name]}; font-weight: bold;")
            grid.addWidget(label, r, 0)
            for c, q in enumerate(("p50", "p99"), start=1):
                cell = QLabel("—")
                cell.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
                grid.addWidget(cell, r, c)
                self.cells[(name, q)] = cell
        self.scope_note = theme.dim(QLabel("no seconds yet"))
        grid.addWidget(self.scope_note, len(self.ROWS) + 1, 0, 1, 3)
        self.histogram = pg.PlotWidget()
        self.histogram.setMinimumHeight(110)
        item = self.histogram.getPlotItem()
        item.setTitle("Seconds by total work", size="10pt")
        item.setLabel("bottom", "ms")
        item.setLabel("left", "seconds")
        item.setMenuEnabled(False)
        item.getViewBox().setMouseEnabled(x=False, y=False)
        self.bars = pg.BarGraphItem(x0=[], x1=[], height=[], brush="#8a8f98", pen=pg.mkPen(None))
        item.addItem(self.bars)
        self.deadline = pg.InfiniteLine(pos=1000.0, angle=90, pen=pg.mkPen(RED, width=1.5, style=Qt.DashLine))
        item.addItem(self.deadline)
        theme.apply_plot(self.histogram)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(grid)
        lay.addWidget(self.histogram, 1)

    def show_stats(self, series: SessionSeries, note: str = "") -> Optional[StageStats]:
        """Fill the table and the histogram from ``series`` (all its rows); "—" when empty."""
        if not len(series):
            for cell in self.cells.values():
                cell.setText("—")
            self.bars.setOpts(x0=[], x1=[], height=[])
            self.scope_note.setText("no seconds yet")
            return None
        st = series.stage_stats()
        for name in self.ROWS:
            self.cells[(name, "p50")].setText(f"{st.p50[name]:.0f} ms")
            self.cells[(name, "p99")].setText(f"{st.p99[name]:.0f} ms")
        self.bars.setOpts(x0=st.bins[:-1], x1=st.bins[1:], height=st.counts)
        self.deadline.setValue(series.deadline_ms)
        self.histogram.getPlotItem().setXRange(0, float(st.bins[-1]), padding=0.02)
        self.histogram.getPlotItem().setYRange(0, max(1, int(st.counts.max())) * 1.1, padding=0)
        self.scope_note.setText(note or f"over {st.seconds} s")
        return st
