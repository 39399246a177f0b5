"""Badges: the small coloured labels of the window's figure rows (the summary row, the conversation's
readouts), laid out in a grid, each with its tooltip, restyled only when its colour changes."""
from __future__ import annotations

from typing import Dict, Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget


def badge_grid(owner: QWidget, keys: Sequence[str], tips: Dict[str, str], columns: int) -> Dict[str, QLabel]:
    """One centred label a key in ``owner``'s grid (``columns`` to a row, no margins, 4 px apart), its
    tooltip from ``tips``; {key: label}."""
    lay = QGridLayout(owner)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(4)
    labels = {}
    for i, k in enumerate(keys):
        lab = QLabel()
        lab.setAlignment(Qt.AlignCenter)
        lab.setToolTip(tips[k])
        lay.addWidget(lab, i // columns, i % columns)
        labels[k] = lab
    return labels


def paint(lab: QLabel, text: str, colour: str, bold: bool = False) -> None:
    """``text`` in white on ``colour``; the style sheet is set only when the colour changes (a restyle
    costs a polish)."""
    lab.setText(text)
    if lab.property("colour") != colour:
        lab.setProperty("colour", colour)
        lab.setStyleSheet(f"background: {colour}; color: white; border-radius: 4px; padding: 3px 6px;"
                          + ("font-weight: bold;" if bold else ""))
