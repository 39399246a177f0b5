"""The mouse wheel scrolls the panels; it changes a control only when the user has focused that control.

Qt hands a wheel turn to whatever combo box, spin box or slider lies under the pointer and gives it focus
(``Qt.WheelFocus``): scrolling the side panels past the Input picker switched the live microphone, and past
"WAV file…" opened a file dialog. :func:`install` puts one filter on the application: every such control it
polishes gets ``Qt.StrongFocus`` (a click or Tab focuses it, a wheel turn does not), and a wheel event for one
that has no focus is ignored there, so it goes on to the scroll area around it. A focused control still
follows the wheel.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QApplication, QComboBox, QWidget

#: the guard's object name (one per application)
NAME = "duplexcadence-wheel-guard"
#: the controls whose value a wheel turn changes
GUARDED = (QComboBox, QAbstractSpinBox, QAbstractSlider)


def _guarded(obj: QObject) -> bool:
    """A value control (not a scroll bar: a scroll bar's wheel is the scrolling itself)."""
    return isinstance(obj, GUARDED) and not obj.inherits("QScrollBar")


class WheelGuard(QObject):
    """The application's filter: value controls take the wheel only while focused."""

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind == QEvent.Polish and _guarded(obj):
            obj.setFocusPolicy(Qt.StrongFocus)
        elif kind == QEvent.Wheel and _guarded(obj) and not obj.hasFocus():
            event.ignore()                      # not for this control: the scroll area around it takes it
            return True
        return False


def guard(widget: QWidget) -> None:
    """Guard the controls already inside ``widget`` (those made later are guarded when Qt polishes them)."""
    for child in widget.findChildren(QWidget):
        if _guarded(child):
            child.setFocusPolicy(Qt.StrongFocus)


def install() -> WheelGuard:
    """Install the guard on the running QApplication (once; later calls return the same guard)."""
    app = QApplication.instance()
    found = app.findChild(WheelGuard, NAME)
    if found is not None:
        return found
    g = WheelGuard(app)
    g.setObjectName(NAME)
    app.installEventFilter(g)
    return g
