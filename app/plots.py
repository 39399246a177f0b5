"""Live plots (pyqtgraph, updated from the GUI thread) and the input level meter.

:class:`TimingPlot`: per-second LISTEN / THINK / SPEAK as stacked bars, the 1 s deadline as a dashed
line, missed seconds outlined and marked in red. :class:`MemoryPlot`: the engine's state arena and
the torch allocator's reserved bytes over time. Both redraw from a :class:`SessionSeries`.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.viewmodel import GREEN, RED, YELLOW, SessionSeries

# No antialiasing and no grid: with them a repaint of the two plots costs ~100 ms of the GUI
# thread on a small CPU (measured offscreen, 2 cores), and every second brings one repaint.
pg.setConfigOptions(background="w", foreground="#222222", antialias=False)

STAGE_COLOURS = {"listen": "#4c78a8", "think": "#b279a2", "speak": "#59a14f"}
#: how many seconds the plots show (scrolling window)
VISIBLE_S = 120


def _style(plot: pg.PlotItem, title: str, ylabel: str) -> None:
    plot.setTitle(title, size="10pt")
    plot.setLabel("left", ylabel)
    plot.getAxis("left").enableAutoSIPrefix(False)
    plot.setLabel("bottom", "session second")
    plot.setMenuEnabled(False)
    plot.getViewBox().setMouseEnabled(x=False, y=False)


class TimingPlot(pg.PlotWidget):
    """Stacked per-second stage times against the deadline; misses in red."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setMinimumHeight(220)
        item = self.getPlotItem()
        _style(item, "Per-second work: LISTEN / THINK / SPEAK vs the 1 s deadline", "ms")
        self.legend = item.addLegend(offset=(8, 4), colCount=4, labelTextSize="8pt")
        self.bars = {}
        for name, colour in STAGE_COLOURS.items():
            bar = pg.BarGraphItem(x=[], height=[], width=0.8, brush=colour, pen=pg.mkPen(None), name=name.upper())
            item.addItem(bar)
            self.bars[name] = bar
        self.miss_bars = pg.BarGraphItem(x=[], height=[], width=0.9, brush=pg.mkBrush(None),
                                         pen=pg.mkPen(RED, width=2.5))
        item.addItem(self.miss_bars)
        self.miss_marks = pg.ScatterPlotItem(symbol="t", size=10, brush=RED, pen=pg.mkPen(RED), name="missed")
        item.addItem(self.miss_marks)
        self.deadline = pg.InfiniteLine(pos=1000.0, angle=0, pen=pg.mkPen(RED, width=1.5, style=Qt.DashLine),
                                        label="deadline {value:.0f} ms",
                                        labelOpts={"position": 0.01, "color": RED, "anchors": [(0, 1), (0, 1)]})
        item.addItem(self.deadline)
        item.setYRange(0, 1300)
        item.setXRange(-0.5, 10.5)

    def update_from(self, series: SessionSeries) -> None:
        series = series.window(VISIBLE_S)
        if not len(series):
            for bar in self.bars.values():
                bar.setOpts(x=[], height=[], y0=[])
            self.miss_bars.setOpts(x=[], height=[], y0=[])
            self.miss_marks.setData([], [])
            return
        x = series.index()
        stages = series.stages()
        base = np.zeros_like(x)
        for name in ("listen", "think", "speak"):
            self.bars[name].setOpts(x=x, height=stages[name], y0=base.copy())
            base = base + stages[name]
        missed = series.missed()
        self.miss_bars.setOpts(x=x[missed], height=base[missed], y0=np.zeros(int(missed.sum())))
        self.miss_marks.setData(x[missed], base[missed] + 0.04 * series.deadline_ms)
        self.deadline.setValue(series.deadline_ms)
        top = max(1.3 * series.deadline_ms, float(base.max()) * 1.15)   # headroom for the legend
        self.getPlotItem().setYRange(0, top, padding=0)
        first, last = float(x[0]), float(x[-1])
        self.getPlotItem().setXRange(first - 0.5, max(first + 10.5, last + 0.5), padding=0)


class MemoryPlot(pg.PlotWidget):
    """State arena bytes and allocator reserved bytes (MiB) per second."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setMinimumHeight(170)
        item = self.getPlotItem()
        _style(item, "State memory", "MiB")
        item.addLegend(offset=(8, 4), colCount=2, labelTextSize="8pt")
        self.state = item.plot([], [], pen=pg.mkPen("#4c78a8", width=2), symbol="o", symbolSize=4,
                               symbolBrush="#4c78a8", name="engine state arena")
        self.reserved = item.plot([], [], pen=pg.mkPen("#f28e2b", width=2, style=Qt.DashLine), symbol="s",
                                  symbolSize=4, symbolBrush="#f28e2b", name="torch allocator reserved (CUDA only)")
        item.setXRange(-0.5, 10.5)

    def update_from(self, series: SessionSeries) -> None:
        series = series.window(VISIBLE_S)
        if not len(series):
            self.state.setData([], [])
            self.reserved.setData([], [])
            return
        x = series.index()
        mem = series.memory_mib()
        peak = max(float(mem["state"].max()), float(mem["reserved"].max()))
        unit, scale = ("GiB", 1 / 1024) if peak >= 4096 else ("MiB", 1.0) if peak >= 1 else ("KiB", 1024.0)
        self.state.setData(x, mem["state"] * scale)
        self.reserved.setData(x, mem["reserved"] * scale)
        item = self.getPlotItem()
        item.setLabel("left", unit)
        item.setYRange(0, max(peak * scale, 1e-3) * 1.35, padding=0)
        first, last = float(x[0]), float(x[-1])
        item.setXRange(first - 0.5, max(first + 10.5, last + 0.5), padding=0)


class LevelMeter(QWidget):
    """Horizontal input level meter, -60..0 dBFS, green / yellow (-18) / red (-6)."""

    FLOOR_DB = -60.0

    def __init__(self, parent=None):
        super().__init__(parent)
        self.level_db = self.FLOOR_DB
        self.setMinimumSize(160, 18)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setToolTip("microphone input level (dBFS), measured before the push-to-talk gate")

    def set_level(self, db: float) -> None:
        self.level_db = max(self.FLOOR_DB, min(0.0, float(db)))
        self.update()

    def fraction(self) -> float:
        return (self.level_db - self.FLOOR_DB) / -self.FLOOR_DB

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.fillRect(r, QColor("#e8e8e8"))
        colour = RED if self.level_db >= -6 else YELLOW if self.level_db >= -18 else GREEN
        p.fillRect(QRectF(r.x(), r.y(), r.width() * self.fraction(), r.height()), QColor(colour))
        p.setPen(QColor("#444444"))
        p.drawRect(r)
        text = "silent" if self.level_db <= self.FLOOR_DB else f"{self.level_db:.0f} dBFS"
        p.drawText(r, Qt.AlignCenter, text)
        p.end()
