"""Light and dark: the window and its plots follow the application palette.

The palette is the system's (Qt follows the desktop's light/dark setting where the platform
theme reports it). ``DUPLEXCADENCE_THEME=dark`` or ``=light`` forces one (the Fusion style with a
dark or the standard palette): screenshots and tests use it. Plots take their background and
foreground from the palette, and :func:`apply_plot` is called again whenever the palette changes.
"""
from __future__ import annotations

import os
from typing import Optional

import pyqtgraph as pg
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QLabel, QStyleFactory, QWidget

THEME_ENV = "DUPLEXCADENCE_THEME"


def dark_palette() -> QPalette:
    """A dark palette for the Fusion style."""
    p = QPalette()
    base, window, text = QColor("#1e1f22"), QColor("#2b2d31"), QColor("#e6e6e6")
    for role, colour in ((QPalette.Window, window), (QPalette.WindowText, text), (QPalette.Base, base),
                         (QPalette.AlternateBase, window), (QPalette.ToolTipBase, window),
                         (QPalette.ToolTipText, text), (QPalette.Text, text), (QPalette.Button, window),
                         (QPalette.ButtonText, text), (QPalette.BrightText, QColor("#ff6b6b")),
                         (QPalette.Highlight, QColor("#3d7bd9")), (QPalette.HighlightedText, QColor("white")),
                         (QPalette.Link, QColor("#6ea8fe")), (QPalette.PlaceholderText, QColor("#8f939a")),
                         (QPalette.Mid, QColor("#4a4d52")), (QPalette.Dark, QColor("#151618")),
                         (QPalette.Light, QColor("#3a3d42")), (QPalette.Midlight, QColor("#34373c"))):
        p.setColor(role, colour)
    for role in (QPalette.Text, QPalette.ButtonText, QPalette.WindowText):
        p.setColor(QPalette.Disabled, role, QColor("#75797f"))
    return p


def apply_env_theme(app: Optional[QApplication] = None) -> str:
    """Force the palette named by $DUPLEXCADENCE_THEME ("dark" / "light"); returns what was applied
    ("" when the variable is unset: the system palette stays). An unknown value is ignored."""
    app = app or QApplication.instance()
    choice = os.environ.get(THEME_ENV, "").strip().lower()
    if app is None or choice not in ("dark", "light"):
        return ""
    app.setStyle(QStyleFactory.create("Fusion"))
    app.setPalette(dark_palette() if choice == "dark" else app.style().standardPalette())
    app.setStyleSheet(DARK_INDICATORS if choice == "dark" else "")
    return choice


#: Fusion draws radio buttons and check boxes from the palette's shadow colours, nearly invisible on a dark
#: window: in dark mode they get a light outline and a blue mark
DARK_INDICATORS = """
QRadioButton::indicator, QCheckBox::indicator { width: 13px; height: 13px; border: 1px solid #aab0b8;
    background: #1e1f22; }
QRadioButton::indicator { border-radius: 7px; }
QCheckBox::indicator { border-radius: 2px; }
QRadioButton::indicator:checked { background: qradialgradient(cx:0.5, cy:0.5, radius:0.5, fx:0.5, fy:0.5,
    stop:0 #6ea8fe, stop:0.55 #6ea8fe, stop:0.65 #1e1f22, stop:1 #1e1f22); }
QCheckBox::indicator:checked { background: #3d7bd9; border-color: #6ea8fe; }
QRadioButton::indicator:disabled, QCheckBox::indicator:disabled { border-color: #5a5e64; }
"""


def is_dark(palette: Optional[QPalette] = None) -> bool:
    palette = palette or QApplication.palette()
    return palette.color(QPalette.Window).lightness() < 128


def plot_colours(palette: Optional[QPalette] = None) -> tuple:
    """(background, foreground) for plots from the palette: Base behind, Text in front."""
    palette = palette or QApplication.palette()
    return palette.color(QPalette.Base), palette.color(QPalette.Text)


def apply_plot(widget: pg.PlotWidget, palette: Optional[QPalette] = None) -> None:
    """Give a plot the palette's background and foreground (axes, ticks, title, legend)."""
    bg, fg = plot_colours(palette)
    widget.setBackground(bg)
    item = widget.getPlotItem()
    for name in ("left", "bottom", "right", "top"):
        axis = item.getAxis(name)
        axis.setPen(pg.mkPen(fg))
        axis.setTextPen(pg.mkPen(fg))
    if item.titleLabel.text:
        item.setTitle(item.titleLabel.text, size="10pt", color=fg)
    legend = item.legend
    if legend is not None:
        legend.setLabelTextColor(fg)
        legend.setBrush(pg.mkBrush(QColor(bg.red(), bg.green(), bg.blue(), 200)))


def apply_all(root: QWidget, palette: Optional[QPalette] = None) -> int:
    """Re-theme every plot under ``root``; returns how many."""
    plots = root.findChildren(pg.PlotWidget)
    for p in plots:
        apply_plot(p, palette)
    return len(plots)


def dim(label: QLabel) -> QLabel:
    """Secondary text: the palette's placeholder colour (readable in light and dark)."""
    label.setForegroundRole(QPalette.PlaceholderText)
    return label
