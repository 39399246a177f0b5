"""Banners above the plots, in the layout: showing one makes room for it and never covers a plot.

Each banner is a word-wrapped :class:`QLabel` with a coloured background; a click dismisses it.
:class:`BannerStack` is a column of them that the window places in its layout above the plots.
"""
from __future__ import annotations

from typing import List

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

COLOURS = {"error": "#f4b6b2", "warning": "#fbe3a6", "info": "#cfe3f6"}


class Banner(QLabel):
    """One banner: coloured, word-wrapped, dismissed by a click."""

    def __init__(self, colour: str, parent=None):
        super().__init__(parent)
        self.setWordWrap(True)
        self.setCursor(Qt.PointingHandCursor)
        self.set_colour(colour)
        self.setToolTip("click to dismiss")
        self.hide()

    def set_colour(self, colour: str) -> None:
        self.setStyleSheet(f"background: {colour}; color: black; padding: 6px 10px; border-radius: 4px;")

    def mousePressEvent(self, event) -> None:
        self.hide()


class BannerStack(QWidget):
    """Banners in a column of their own, placed in the layout above the plots: showing one moves the plots
    down, it never covers them (``host`` is kept for callers that pass it; the stack is not its overlay)."""

    def __init__(self, host: QWidget = None):
        super().__init__(host)
        self.host = host
        self.banners: List[Banner] = []
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(4)
        self.hide()

    def add(self, colour: str) -> Banner:
        banner = Banner(colour, self)
        self._lay.addWidget(banner)
        banner.installEventFilter(self)
        self.banners.append(banner)
        return banner

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj in self.banners and event.type() in (QEvent.ShowToParent, QEvent.HideToParent):
            self.place()
        return False

    def place(self) -> None:
        """Shown while any banner is (the layout makes room for it)."""
        self.setVisible(any(not b.isHidden() for b in self.banners))
