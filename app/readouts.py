"""The conversation's own figures and controls: the reply gap, barge-in latency, playback gaps, echo suppression,
dropped speech (:class:`ReadoutRow`), and the user's controls (:class:`ConversationPanel`): echo cancellation (on by
default, with a "use headphones" hint when it is off and a speaker plays), force-listen, interrupt
sensitivity and the playback delay. Every control takes effect at the next second (the controller's
``set_*``), and the records say so from that second on.
"""
from __future__ import annotations

import re
from typing import Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox, QLabel,
                               QWidget)

from app import theme
from app.badges import badge_grid, paint
from app.viewmodel import GREEN, GREY, RED, YELLOW
from engine.echo import SENSITIVITY
from engine.stats import percentile

HEADPHONES = re.compile(r"head(phone|set)|earbud|earphone|airpods|buds", re.I)
HEADPHONES_HINT = ("Echo cancellation is off and the sound comes from a speaker: use headphones, or the model "
                   "hears itself and interrupts itself.")


class ReadoutRow(QWidget):
    """Barge-in latency, playback gaps, echo suppression, dropped speech: the latest second and the session."""

    KEYS = ("reply", "barge_in", "gaps", "echo", "dropped")
    TIPS = {"reply": "reply gap: the end of your speech to the model's first audio at the speaker, per turn: the "
                     "median and the 90th percentile over the session (the count: turns answered)",
            "barge_in": "barge-in latency: your first word to the model's playback falling silent (the latest "
                        "barge-in; the count is the whole session)",
            "gaps": "playback gaps: times the speaker's queue ran dry, and the silence they played (this second; "
                    "the whole session)",
            "echo": "echo suppression while the model speaks: how much of the speaker's sound the canceller took "
                    "out of the microphone (the latest second the model spoke)",
            "dropped": "speech dropped to keep the delay bounded (late speech at the head of the speaker's queue), "
                       "and input seconds dropped because the engine was behind (whole session)"}

    def __init__(self, parent=None):
        super().__init__(parent)
        self.labels = badge_grid(self, self.KEYS, self.TIPS, 3)     # two rows: the row fits a narrow window
        self._barge = (0, None)
        self._gaps: list = []
        self.show_row(None)

    def _set(self, key: str, text: str, colour: str) -> None:
        paint(self.labels[key], text, colour)

    def reset(self) -> None:
        self._barge = (0, None)
        self._gaps = []
        self._sup = 0.0
        self.show_row(None)

    def show_row(self, row: Optional[dict], totals: Optional[dict] = None, rows=None,
                 echo: Optional[str] = None) -> None:
        """The latest second's ``row`` (None: no data) and the session's ``totals`` (live: the controller's;
        a replay: computed from ``rows``); ``echo``: the canceller's state ("on", "off", "no speaker")."""
        if rows is not None:
            totals = session_totals(rows)
        t = totals or {}
        if row is None:
            for k, text in (("reply", "reply —"), ("barge_in", "barge-in —"), ("gaps", "gaps —"),
                            ("echo", "echo —"), ("dropped", "dropped —")):
                self._set(k, text, GREY)
            return
        self._show_reply(row, rows)
        n, last = self._barge
        if rows is not None:
            n = sum(int(r.get("barge_ins", 0)) for r in rows)
            lat = [float(r.get("barge_in_latency_ms", 0)) for r in rows if r.get("barge_ins")]
            last = lat[-1] if lat else None
        elif row.get("barge_ins"):
            n, last = n + int(row["barge_ins"]), float(row.get("barge_in_latency_ms", 0.0))
            self._barge = (n, last)
        self._set("barge_in", f"barge-in {last:.0f} ms ({n})" if last is not None else f"barge-in — ({n})",
                  GREY if last is None else GREEN if last <= 300 else YELLOW if last <= 600 else RED)
        gaps, gap_ms = int(row.get("playback_gaps", 0)), float(row.get("playback_gap_ms", 0.0))
        self._set("gaps", f"gaps {gaps} ({gap_ms:.0f} ms) · {int(t.get('gap_events', 0))} in all",
                  GREEN if not gaps else YELLOW if gap_ms < 100 else RED)
        sup = float(row.get("echo_suppression_db", 0.0))
        if rows is not None:                      # the last reply's suppression (listening seconds have none)
            sups = [float(r.get("echo_suppression_db", 0.0)) for r in rows if r.get("echo_suppression_db")]
            sup = sups[-1] if sups else 0.0
        elif sup > 0:
            self._sup = sup
        else:
            sup = getattr(self, "_sup", 0.0)
        on = bool(row.get("echo_cancellation"))
        if not on:                                # cancellation off: no suppression, not the last one's
            sup = self._sup = 0.0
        state = echo or ("on" if on else "off")
        self._set("echo", f"echo −{sup:.0f} dB" if sup > 0 else f"echo {state}",
                  GREY if not on else GREEN if sup >= 20 or not sup else YELLOW)
        dropped = float(t.get("dropped_speech_ms", 0.0)) / 1000.0
        lost_in = int(t.get("input_dropped", 0))
        self._set("dropped", f"dropped {dropped:.1f} s speech · {lost_in} s input",
                  GREEN if not dropped and not lost_in else YELLOW)


    def _show_reply(self, row: dict, rows) -> None:
        """The reply gap's median and 90th percentile over the session (live: the gaps seen so far)."""
        if rows is not None:
            self._gaps = [float(r.get("reply_gap_ms", 0.0)) for r in rows if float(r.get("reply_gap_ms", 0.0)) > 0]
        elif float(row.get("reply_gap_ms", 0.0)) > 0:
            self._gaps.append(float(row["reply_gap_ms"]))
        if not self._gaps:
            self._set("reply", "reply —", GREY)
            return
        p50, p90 = percentile(self._gaps, 50) / 1000.0, percentile(self._gaps, 90) / 1000.0
        self._set("reply", f"reply {p50:.1f} s · p90 {p90:.1f} ({len(self._gaps)})",
                  GREEN if p50 <= 2.0 else YELLOW if p50 <= 3.0 else RED)


def session_totals(rows) -> dict:
    """Whole-session totals from per-second rows (a replay)."""
    return {"gap_events": sum(int(r.get("playback_gaps", 0)) for r in rows),
            "gap_ms": sum(float(r.get("playback_gap_ms", 0.0)) for r in rows),
            "dropped_speech_ms": sum(float(r.get("dropped_speech_ms", 0.0)) for r in rows),
            "input_dropped": 0}


class ConversationPanel(QGroupBox):
    """Echo cancellation, force-listen, interrupt sensitivity, playback delay (each from the next second)."""

    echo_changed = Signal(bool)
    force_listen_changed = Signal(bool)
    sensitivity_changed = Signal(str)
    delay_changed = Signal(float)

    def __init__(self, parent=None):
        super().__init__("Conversation", parent)
        self.echo = QCheckBox("Echo cancellation (WebRTC AEC3)")
        self.echo.setChecked(True)
        self.echo.setToolTip("removes the model's own voice, played by the speaker, from the microphone")
        self.hint = QLabel(HEADPHONES_HINT)
        self.hint.setWordWrap(True)
        self.hint.setStyleSheet(f"color: {YELLOW}; font-weight: bold;")
        self.hint.hide()
        self.force_listen = QCheckBox("Force listen (the model may not start speaking)")
        self.sensitivity = QComboBox()
        for name, (abs_db, margin) in SENSITIVITY.items():
            self.sensitivity.addItem(f"{name} (speech above {abs_db:.0f} dBFS)", name)
        self.sensitivity.setCurrentIndex(self.sensitivity.findData("normal"))
        self.sensitivity.setToolTip("how loud your voice must be to interrupt the model (the barge-in threshold)")
        self.delay = QDoubleSpinBox()
        self.delay.setRange(0.0, 3.0)
        self.delay.setSingleStep(0.1)
        self.delay.setDecimals(1)
        self.delay.setSuffix(" s")
        self.delay.setToolTip("the playback delay (buffer): the speaker's queue holds this plus 1 s at most; "
                              "late speech beyond it is dropped")
        note = theme.dim(QLabel("Each applies at the next second and is marked on the plots."))
        note.setWordWrap(True)
        form = QFormLayout(self)
        form.addRow(self.echo)
        form.addRow(self.hint)
        form.addRow(self.force_listen)
        form.addRow("Interrupt", self.sensitivity)
        form.addRow("Playback delay", self.delay)
        form.addRow(note)
        self.echo.toggled.connect(self.echo_changed.emit)
        self.force_listen.toggled.connect(self.force_listen_changed.emit)
        self.sensitivity.activated.connect(lambda _: self.sensitivity_changed.emit(self.sensitivity.currentData()))
        self.delay.editingFinished.connect(lambda: self.delay_changed.emit(self.delay.value()))
        self._output = ""

    def show_controls(self, u, quiet: bool = False) -> None:
        """Show the controls ``u`` (a ``UserControls``); ``quiet``: without emitting a change."""
        widgets = (self.echo, self.sensitivity, self.delay)
        for w in widgets:
            w.blockSignals(quiet)
        self.echo.setChecked(u.echo)
        self.sensitivity.setCurrentIndex(max(0, self.sensitivity.findData(u.sensitivity)))
        self.delay.setValue(u.delay_s)
        for w in widgets:
            w.blockSignals(False)

    def show_output(self, device_name: Optional[str]) -> None:
        """The speaker in use (None: nothing plays): the headphones hint follows it and the echo toggle."""
        self._output = device_name or ""
        self.update_hint()

    def update_hint(self) -> None:
        speaker = bool(self._output) and not HEADPHONES.search(self._output)
        self.hint.setVisible(speaker and not self.echo.isChecked())
