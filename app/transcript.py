"""What was said, second by second: the model's text and the user's voice-activity segments.

:func:`transcript_lines` turns per-second rows (live records or a replayed export) into lines in time order:
the user's speech as segments (``[3–6 s] user speaking``) from the records' voice activity, and every second the
model spoke with the text its backbone produced that second (an LLM's text, Moshi's with a tokenizer)
or "—" for a backbone without text. :class:`TranscriptView` shows them beside the plots, scrolling with the
session; exports carry them as ``transcript.txt`` (:func:`transcript_text`).
"""
from __future__ import annotations

from typing import Iterable, List

from PySide6.QtGui import QFont
from PySide6.QtWidgets import QPlainTextEdit

NO_TEXT = "—"
TRANSCRIPT = "transcript.txt"


def _span(a: int, b: int) -> str:
    return f"[{a} s]" if a == b else f"[{a}–{b} s]"


def transcript_lines(rows: Iterable[dict]) -> List[str]:
    """Lines in time order: user segments (voice activity) and the model's text per speaking second."""
    out: List[str] = []
    start = last = None
    for r in rows:
        k = int(r.get("index", 0))
        if r.get("user_speech"):
            start = k if start is None else start
            last = k
        elif start is not None:
            out.append(f"{_span(start, last)} user speaking")
            start = None
        if r.get("decision") == "speak":
            text = " ".join(str(r.get("text") or "").split())
            out.append(f"[{k} s] model: {text or NO_TEXT}")
    if start is not None:
        out.append(f"{_span(start, last)} user speaking (…)")
    return out


def transcript_text(rows: Iterable[dict]) -> str:
    lines = transcript_lines(rows)
    head = "DuplexCadence transcript: the model's text per second it spoke (— = its backbone has no text) " \
           "and the user's voice-activity segments\n"
    return head + "".join(line + "\n" for line in lines)


class TranscriptView(QPlainTextEdit):
    """The transcript, scrolling with the session (read-only)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setMaximumBlockCount(5000)
        self.setLineWrapMode(QPlainTextEdit.WidgetWidth)
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() * 0.95))
        self.setFont(font)
        self.setPlaceholderText("Transcript: the model's text second by second (— for a backbone without "
                                "text) and your voice-activity segments.")
        self.setToolTip(self.placeholderText())
        self._shown: List[str] = []

    def show_rows(self, rows: List[dict]) -> None:
        """Show the transcript of ``rows``; only changed lines at the end are redrawn (cheap every second)."""
        lines = transcript_lines(rows[-600:]) if len(rows) > 600 else transcript_lines(rows)
        same = 0
        while same < min(len(lines), len(self._shown)) and lines[same] == self._shown[same]:
            same += 1
        if same < len(self._shown) or not self._shown:
            self.setPlainText("\n".join(lines))
        else:
            for line in lines[same:]:
                self.appendPlainText(line)
        self._shown = lines
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
