"""Banners that float over the top of a widget, so showing one never moves the layout below it.

Each banner is a word-wrapped :class:`QLabel` with a coloured background; a click dismisses it.
:class:`BannerStack` is a child of its ``host`` (not in the host's layout): it covers the host's
top edge, as tall as its visible banners, and follows the host's size.
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
    """Banners over the top of ``host``; the host's layout never changes when one shows or hides."""

    MARGIN = 6

    def __init__(self, host: QWidget):
        super().__init__(host)
        self.host = host
        self.banners: List[Banner] = []
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(4)
        host.installEventFilter(self)
        self.hide()

    def add(self, colour: str) -> Banner:
        banner = Banner(colour, self)
        self._lay.addWidget(banner)
        banner.installEventFilter(self)
        self.banners.append(banner)
        return banner

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        kind = event.type()
        if (obj is self.host and kind == QEvent.Resize) or (obj in self.banners and kind in (QEvent.ShowToParent,
                                                                                          QEvent.HideToParent)):
            self.place()
        return False

    def place(self) -> None:
        """Cover the host's top edge with the visible banners (or hide when none is shown)."""
        shown = [b for b in self.banners if not b.isHidden()]
        if not shown:
            self.hide()
            return
        width = max(100, self.host.width() - 2 * self.MARGIN)
        height = sum(b.heightForWidth(width) if b.hasHeightForWidth() else b.sizeHint().height() for b in shown)
        height += self._lay.spacing() * (len(shown) - 1)
        self.setGeometry(self.MARGIN, self.MARGIN, width, height)
        self.show()
        self.raise_()
