"""Live plots (pyqtgraph, updated from the GUI thread) and the input level meter.

:class:`TimingPlot`: per-second LISTEN / THINK / SPEAK as stacked bars, the 1 s deadline as a dashed
line, missed seconds outlined and marked in red, a labelled vertical line where a toggle took
effect (labels stacked so they never overlap), and SPEAK in a paler green in listening seconds (the tail runs on silence tokens; a second
whose record says the tail was skipped has no SPEAK bar). :class:`MemoryPlot`: the engine's state arena and
the torch allocator's reserved bytes over time, and on CUDA the card's total memory (and the process cap) as
labelled lines from the session's info. Both redraw from a :class:`SessionSeries`.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

from app import theme
from app.viewmodel import GREEN, RED, YELLOW, SessionSeries

# No antialiasing and no grid: with them a repaint of the two plots costs ~100 ms of the GUI
# thread on a small CPU (measured offscreen, 2 cores), and every second brings one repaint.
# Colours come from the palette (app/theme.py), set on each plot.
pg.setConfigOptions(antialias=False)

STAGE_COLOURS = {"listen": "#4c78a8", "think": "#b279a2", "speak": "#59a14f"}
#: SPEAK in a listening second: the decoder tail runs on silence tokens
LISTENING_SPEAK = "#a9d39e"
LISTENING_SPEAK_NAME = "SPEAK on silence (listening)"
TOGGLE_COLOUR = "#e17c05"
#: the heights (a share of the plot) toggle labels take, top first, and the room kept after each label (px)
LABEL_ROWS = (0.93, 0.81, 0.69, 0.57)
LABEL_GAP_PX = 8
#: how many seconds the plots show (scrolling window)
VISIBLE_S = 120


def _style(plot: pg.PlotItem, title: str, ylabel: str) -> None:
    plot.setTitle(title, size="10pt")
    plot.setLabel("left", ylabel)
    plot.getAxis("left").enableAutoSIPrefix(False)
    plot.setLabel("bottom", "session second")
    plot.setMenuEnabled(False)
    plot.getViewBox().setMouseEnabled(x=False, y=False)


def fit_legend(plot: pg.PlotWidget, legend: pg.LegendItem, most: int) -> None:
    """As many legend columns (at most ``most``) as the plot's width holds: a narrow plot wraps its legend
    into more rows instead of running its labels off the plot."""
    font = plot.font()
    font.setPointSizeF(8.0)
    widths = [QFontMetrics(font).horizontalAdvance(label.text) + 34 for _, label in legend.items] or [0]
    room = plot.width() - 90                                  # the axis and the legend's offset
    cols = next((k for k in range(min(most, len(widths)), 1, -1)
                 if sum(max(widths[j::k]) for j in range(k)) <= room), 1)
    if legend.columnCount != cols:
        legend.setColumnCount(cols)


def toggle_label(change: dict) -> str:
    """The marker text for a toggle or control change: what changed from that second."""
    if change.get("label"):
        return change["label"]
    on = [n for n, k in (("demand", "demand_sized"), ("graphs", "graph_replay")) if change[k]]
    return "+".join(on) if on else "stock-like"


class TimingPlot(pg.PlotWidget):
    """Stacked per-second stage times against the deadline; misses in red; toggle changes marked."""

    def __init__(self, parent=None, visible_s: int = VISIBLE_S):
        super().__init__(parent)
        self.visible_s = visible_s
        self.setMinimumHeight(160)
        self.setToolTip("Per second: LISTEN (encode the microphone), THINK (the backbone), SPEAK (the decoder "
                        "tail).\nPale green: a listening second — the tail still runs, on silence tokens, "
                        "unless the model skips it.\nOrange lines: where an engine toggle took effect.")
        item = self.getPlotItem()
        _style(item, "Per-second work vs the 1 s deadline", "ms")
        self.legend = item.addLegend(offset=(8, 4), colCount=5, labelTextSize="8pt")
        self.bars = {}
        for name, colour in STAGE_COLOURS.items():
            bar = pg.BarGraphItem(x=[], height=[], width=0.8, brush=colour, pen=pg.mkPen(None), name=name.upper())
            item.addItem(bar)
            self.bars[name] = bar
        self.listening_speak = pg.BarGraphItem(x=[], height=[], width=0.8, brush=LISTENING_SPEAK,
                                               pen=pg.mkPen(None), name=LISTENING_SPEAK_NAME)
        item.addItem(self.listening_speak)
        self.toggle_lines: list = []
        self.miss_bars = pg.BarGraphItem(x=[], height=[], width=0.9, brush=pg.mkBrush(None),
                                         pen=pg.mkPen(RED, width=2.5))
        item.addItem(self.miss_bars)
        self.miss_marks = pg.ScatterPlotItem(symbol="t", size=10, brush=RED, pen=pg.mkPen(RED), name="missed")
        item.addItem(self.miss_marks)
        self.deadline = pg.InfiniteLine(pos=1000.0, angle=0, pen=pg.mkPen(RED, width=1.5, style=Qt.DashLine),
                                        label="deadline {value:.0f} ms",
                                        labelOpts={"position": 0.99, "color": RED, "anchors": [(1, 0), (1, 0)]})
        item.addItem(self.deadline)
        item.setYRange(0, 1300)
        item.setXRange(-0.5, 10.5)
        item.getViewBox().sigResized.connect(               # a narrower plot: the labels are laid out again
            lambda *_: self._lay_out_labels([line for line in self.toggle_lines if line.isVisible()]))
        theme.apply_plot(self)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if "legend" in self.__dict__:             # pyqtgraph resizes the widget while it is built
            fit_legend(self, self.legend, 5)

    def update_from(self, series: SessionSeries) -> None:
        full = series
        series = series.window(self.visible_s)
        self._draw(series)
        self._mark_toggles(full, series)          # after the x-range is set: the labels are laid out in it

    def _draw(self, series: SessionSeries) -> None:
        if not len(series):
            for bar in (*self.bars.values(), self.listening_speak, self.miss_bars):
                bar.setOpts(x=[], height=[], y0=[])
            self.miss_marks.setData([], [])
            return
        x = series.index()
        stages = series.stages()
        base = np.zeros_like(x)
        for name in ("listen", "think"):
            self.bars[name].setOpts(x=x, height=stages[name], y0=base.copy())
            base = base + stages[name]
        listening = series.listening()
        self.bars["speak"].setOpts(x=x[~listening], height=stages["speak"][~listening], y0=base[~listening])
        self.listening_speak.setOpts(x=x[listening], height=stages["speak"][listening], y0=base[listening])
        base = base + stages["speak"]
        missed = series.missed()
        self.miss_bars.setOpts(x=x[missed], height=base[missed], y0=np.zeros(int(missed.sum())))
        self.miss_marks.setData(x[missed], base[missed] + 0.04 * series.deadline_ms)
        self.deadline.setValue(series.deadline_ms)
        room = 1.2 + 0.1 * self.legend.rowCount                          # headroom for the legend's rows
        top = max(room * series.deadline_ms, float(base.max()) * (room - 0.15))
        self.getPlotItem().setYRange(0, top, padding=0)
        first, last = float(x[0]), float(x[-1])
        self.getPlotItem().setXRange(first - 0.5, max(first + 10.5, last + 0.5), padding=0)

    def _mark_toggles(self, full: SessionSeries, visible: SessionSeries) -> None:
        """One labelled vertical line per toggle change in the visible seconds (lines are reused)."""
        first = visible.rows[0]["index"] if len(visible) else 0
        changes = [c for c in full.mode_changes() if c["index"] >= first]
        item = self.getPlotItem()
        while len(self.toggle_lines) < len(changes):
            line = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(TOGGLE_COLOUR, width=2, style=Qt.DotLine),
                                   label="toggle", labelOpts={"position": 0.93, "color": TOGGLE_COLOUR, "anchors": [(0, 0.5), (0, 0.5)]})
            item.addItem(line)
            self.toggle_lines.append(line)
        for i, line in enumerate(self.toggle_lines):
            if i < len(changes):
                line.setValue(changes[i]["index"] - 0.5)       # between the last old and the first new second
                line.label.setFormat(f"→ {toggle_label(changes[i])}")
            line.setVisible(i < len(changes))
        self._lay_out_labels(self.toggle_lines[:len(changes)])

    def _lay_out_labels(self, lines: list) -> None:
        """Toggle labels never overlap: each goes in the highest of :data:`LABEL_ROWS` whose last label ends left
        of it; a label with no room in any row is hidden (its line stays; the event log names the change)."""
        px = self.getPlotItem().getViewBox().viewPixelSize()[0]       # seconds per pixel
        if not px or not math.isfinite(px):
            px = (self.visible_s / 600.0)
        ends = [-math.inf] * len(LABEL_ROWS)
        for line in lines:
            label = line.label
            width = (QFontMetrics(label.textItem.font()).horizontalAdvance(label.format) + LABEL_GAP_PX) * px
            x = line.value()
            row = next((k for k, end in enumerate(ends) if end <= x), None)
            label.setVisible(row is not None)
            if row is not None:
                label.setPosition(LABEL_ROWS[row])
                label.valueChanged()                 # a label hidden before missed its new text
                ends[row] = x + width


#: the card's total memory and the process cap (torch.cuda's per-process memory fraction), as horizontal lines
CARD_COLOUR = "#d62728"
CAP_COLOUR = "#8c2d04"
CPU_NOTE = "CPU session: no card line (the GPU's memory does not apply)"
UNRECORDED_NOTE = "card size not recorded in this session"
#: a card line joins the y-range once the reserved memory reaches this share of it
NEAR_SHARE = 0.5


def mib_text(mib: float) -> str:
    """"140.4 GiB" / "812 MiB" / "96 KiB"."""
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB" if mib >= 1 else f"{mib * 1024:.0f} KiB"


def memory_limits(info: dict) -> Tuple[List[Tuple[str, float]], str]:
    """From a session's info: the lines to draw, [(label, MiB)] (the card, then the process cap when one is
    set below it), and a note when there are none ("" when nothing is known about the device yet)."""
    device = str((info or {}).get("device") or "")
    if not device:
        return [], ""
    if not device.startswith("cuda"):
        return [], CPU_NOTE
    total, cap = _size(info.get("device_memory_mib")), _size(info.get("memory_cap_mib"))
    if total is None:
        return [], UNRECORDED_NOTE
    lines = [(f"card {mib_text(total)}", total)]
    if cap is not None and cap < total:
        lines.append((f"process cap {mib_text(cap)} ({100 * cap / total:.0f}% of the card)", cap))
    return lines, ""


def _size(value) -> Optional[float]:
    """A positive, finite number of MiB, else None (a remote engine's info is not trusted to hold one)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None


class MemoryPlot(pg.PlotWidget):
    """State arena bytes and allocator reserved bytes per second; on CUDA the card's total memory (and the
    process cap, when set) as labelled lines, in range once the reserved bytes come within half of one."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setMinimumHeight(110)
        item = self.getPlotItem()
        _style(item, "State memory", "MiB")
        self.legend = item.addLegend(offset=(8, 4), colCount=2, labelTextSize="8pt")
        self.state = item.plot([], [], pen=pg.mkPen("#4c78a8", width=2), symbol="o", symbolSize=4,
                               symbolBrush="#4c78a8", name="engine state arena")
        self.reserved = item.plot([], [], pen=pg.mkPen("#f28e2b", width=2, style=Qt.DashLine), symbol="s",
                                  symbolSize=4, symbolBrush="#f28e2b", name="torch allocator reserved (CUDA only)")
        self.lines = []
        for colour in (CARD_COLOUR, CAP_COLOUR):
            line = pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen(colour, width=1.5, style=Qt.DashDotLine),
                                   label="", labelOpts={"position": 0.02, "color": colour, "anchors": [(0, 1), (0, 1)]})
            line.hide()
            item.addItem(line)
            self.lines.append(line)
        self.key = pg.PlotDataItem([], [])       # the legend's line for the card, or the CPU's note
        item.addItem(self.key)
        self.limits: List[Tuple[str, float]] = []
        self.note = ""
        self.top_mib = 0.0                       # the y-range the data needs, MiB (a comparison shares the larger)
        self._series = SessionSeries()
        item.setXRange(-0.5, 10.5)
        self.visible_s = VISIBLE_S
        theme.apply_plot(self)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if "legend" in self.__dict__:
            fit_legend(self, self.legend, 2)

    def set_info(self, info: dict) -> None:
        """The session's device: CUDA with ``device_memory_mib`` (and ``memory_cap_mib``) draws the lines;
        the CPU, or an older session without them, gets a one-line note in the legend instead."""
        self.limits, self.note = memory_limits(info)
        self.legend.removeItem(self.key)
        if self.limits:
            self.key.setPen(pg.mkPen(CARD_COLOUR, width=1.5, style=Qt.DashDotLine))
            self.legend.addItem(self.key, "card total" + (" · process cap" if len(self.limits) > 1 else ""))
        elif self.note:
            self.key.setPen(pg.mkPen(None))
            self.legend.addItem(self.key, self.note)
        self.update_from(self._series)

    def update_from(self, series: SessionSeries, min_top_mib: float = 0.0) -> None:
        """Redraw the visible seconds; ``min_top_mib``: the y-range reaches at least this far (a comparison)."""
        self._series = series
        series = series.window(self.visible_s)
        item = self.getPlotItem()
        if not len(series):
            self.state.setData([], [])
            self.reserved.setData([], [])
            for line in self.lines:
                line.hide()
            self._texts("MiB", "State memory")
            return
        x = series.index()
        mem = series.memory_mib()
        reserved = float(mem["reserved"].max())
        near = [mib for _, mib in self.limits if reserved >= NEAR_SHARE * mib]
        self.top_mib = max(float(mem["state"].max()), reserved, *near) * 1.35     # room for the legend
        shown = max(self.top_mib, min_top_mib)
        top = shown / 1.35
        unit, scale = ("GiB", 1 / 1024) if top >= 4096 else ("MiB", 1.0) if top >= 1 else ("KiB", 1024.0)
        self.state.setData(x, mem["state"] * scale)
        self.reserved.setData(x, mem["reserved"] * scale)
        for i, line in enumerate(self.lines):
            line.setVisible(i < len(self.limits))
            if i < len(self.limits):
                line.setValue(self.limits[i][1] * scale)
                line.label.setFormat(self.limits[i][0])
        curves = ("state arena, reserved, card" + (" and cap" if len(self.limits) > 1 else "") if self.limits
                  else "state arena, reserved (CUDA only)")
        self._texts(f"{unit}: {curves}", self._title(reserved))
        item.setYRange(0, max(shown * scale, 1e-3), padding=0)
        first, last = float(x[0]), float(x[-1])
        item.setXRange(first - 0.5, max(first + 10.5, last + 0.5), padding=0)

    def _texts(self, axis: str, title: str) -> None:
        """The left axis label and the title, set only when they change (a relayout costs the GUI thread)."""
        item = self.getPlotItem()
        if item.getAxis("left").labelText != axis:
            item.setLabel("left", axis)
        if item.titleLabel.text != title:
            item.titleLabel.setText(title)

    def _title(self, reserved_mib: float) -> str:
        """"State memory", and on CUDA how much of the card (or of the cap) the reserved bytes reached."""
        if not self.limits:
            return "State memory"
        name = "the process cap" if len(self.limits) > 1 else "the card"
        mib = self.limits[-1][1]
        return (f"Memory: reserved peak {mib_text(reserved_mib)}, {100 * reserved_mib / mib:.0f}% of {name} "
                f"({mib_text(mib)})")


class LevelMeter(QWidget):
    """Horizontal level meter, -60..0 dBFS, green / yellow (-18) / red (-6); ``idle_text`` when off."""

    FLOOR_DB = -60.0

    def __init__(self, parent=None, tooltip: str = "microphone input level (dBFS), measured before the "
                                                   "push-to-talk gate"):
        super().__init__(parent)
        self.level_db = self.FLOOR_DB
        self.idle_text = ""
        self.setMinimumSize(120, 18)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setToolTip(tooltip)

    def set_idle(self, text: str) -> None:
        """Show ``text`` instead of a level (e.g. "no playback")."""
        self.idle_text = text
        self.level_db = self.FLOOR_DB
        self.update()

    def set_level(self, db: float) -> None:
        self.idle_text = ""
        self.level_db = max(self.FLOOR_DB, min(0.0, float(db)))
        self.update()

    def fraction(self) -> float:
        return (self.level_db - self.FLOOR_DB) / -self.FLOOR_DB

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        pal = self.palette()
        p.fillRect(r, pal.color(QPalette.AlternateBase if theme.is_dark(pal) else QPalette.Midlight))
        colour = RED if self.level_db >= -6 else YELLOW if self.level_db >= -18 else GREEN
        p.fillRect(QRectF(r.x(), r.y(), r.width() * self.fraction(), r.height()), QColor(colour))
        p.setPen(pal.color(QPalette.Text))
        p.drawRect(r)
        text = self.idle_text or ("silent" if self.level_db <= self.FLOOR_DB else f"{self.level_db:.0f} dBFS")
        p.drawText(r, Qt.AlignCenter, text)
        p.end()
