"""The conversation's controls and audio-path readouts of a session (a mixin of the session controller).

:class:`UserControls` is what the user set (echo cancellation, interrupt sensitivity, playback delay,
force-listen). A control asked during a session is parked and taken when the next second's result comes in:
the record of the second it was asked in carries the request (``requests``), the records from the next one
the new value, so the plots mark it like an engine toggle. Force-listen goes to the engine's
:class:`engine.session.controls.ControlledSession`; the others act in the app's audio path (the frame pump,
the speaker's bounded queue). :meth:`ConversationControls._fill_audio_path` writes the audio path's
per-second readouts (barge-ins and their latency, the reply gap, playback gaps, echo suppression, dropped
speech) into each record before it is journaled.
"""
from __future__ import annotations

from typing import Optional

from engine.session import LiveRunner, SessionConfig
from engine.session.controls import Controls, ControlledSession

#: the controller's states a control acts on at once (app/controller.py)
STARTING, RUNNING = "starting", "running"
#: input seconds that may wait for the engine; a new one beyond this is dropped (counted): no backlog grows
MAX_INPUT_BACKLOG = 2
#: the playback delay (buffer) a session starts with, seconds
DEFAULT_DELAY_S = 0.5


def controlled_runner(cfg: SessionConfig) -> LiveRunner:
    """The app's embedded runner: sessions that follow the user's controls (force-listen). The app says "cannot
    keep up" itself (a banner, the event log, a scripted run's stderr), so the runner does not log it too."""
    return LiveRunner(cfg, session_factory=ControlledSession, log_notice=False)


class UserControls:
    """What the user set for the session's audio path and turns (the GUI thread's copy)."""

    def __init__(self) -> None:
        self.echo = True
        self.sensitivity = "normal"
        self.delay_s = DEFAULT_DELAY_S
        self.force_listen = False


class ConversationControls:
    """Mixed into :class:`app.controller.SessionController` (GUI thread only)."""

    def set_echo(self, on: bool) -> None:
        self._ask("echo", bool(on), f"echo cancellation {'on' if on else 'off'}")

    def set_sensitivity(self, sensitivity: str) -> None:
        self._ask("sensitivity", sensitivity, f"interrupt sensitivity {sensitivity}")

    def set_delay(self, delay_s: float) -> None:
        self._ask("delay_s", float(delay_s), f"playback delay {delay_s:.1f} s")

    def set_force_listen(self, on: bool) -> None:
        self._ask("force_listen", bool(on), f"force-listen {'on' if on else 'off'}")

    def _ask(self, name: str, value, text: str) -> None:
        """A control from the GUI: in effect from the next second (before a session: for the next one)."""
        if self.state not in (STARTING, RUNNING):
            setattr(self.controls, name, value)
            return
        self._asked[name] = value
        self._requests.append(text)
        self.event.emit("toggle", f"requested {text} (from the next second)")
        if name == "force_listen":
            self._ask_engine_controls(value)

    def _ask_engine_controls(self, force_listen: Optional[bool] = None) -> None:
        """Hand force-listen to the engine's session (it takes it at its next second)."""
        on = self.controls.force_listen if force_listen is None else force_listen
        session = getattr(self.runner, "session", None)
        if session is not None and hasattr(session, "set_controls"):
            session.set_controls(Controls(force_listen=on))
        elif self.runner is not None and self.state == RUNNING:
            self.event.emit("warning", "force-listen needs the embedded engine; this session's engine "
                                       "does not take it")

    def _take_asked(self) -> None:
        """The next second came in: the controls asked for are in effect from it."""
        asked, self._asked = self._asked, {}
        for name, value in asked.items():
            setattr(self.controls, name, value)
        pump = self.pump
        if pump is None:
            return
        if "echo" in asked:
            pump.echo_wanted = self.controls.echo
        if "sensitivity" in asked:
            pump.set_sensitivity(self.controls.sensitivity)
        if "delay_s" in asked and pump.playback is not None:
            pump.playback.sink.queue.set_delay(self.controls.delay_s)

    def echo_state(self) -> str:
        """"on", "off" (the user's toggle) or "no speaker" (wanted, but nothing plays: nothing to cancel)."""
        pump = self.pump
        if pump is None:
            return "on" if self.controls.echo else "off"
        if pump.echo_error:
            return "unavailable"
        if not pump.echo_wanted:
            return "off"
        return "on" if pump.playback is not None else "no speaker"

    def _fill_audio_path(self, rec) -> None:
        """The audio path's readouts since the last second go into this second's record."""
        pump, u = self.pump, self.controls
        rec.echo_cancellation = bool(pump.canceller is not None and pump.canceller.enabled)
        rec.barge_in_sensitivity = u.sensitivity
        rec.requests = "; ".join(self._requests)
        self._requests = []
        rec.barge_ins = pump.barge_ins - self._last_barge_ins
        if rec.barge_ins:
            rec.barge_in_latency_ms = round(pump.barge_in_ms[-1], 3)
        self._last_barge_ins = pump.barge_ins
        gaps = pump.path.new_reply_gaps()
        if gaps:
            rec.reply_gap_ms = round(gaps[-1], 3)
        if rec.echo_cancellation and pump.far_db > -200:
            sup = pump.canceller.suppression_db()
            rec.echo_suppression_db = round(sup, 3) if sup is not None and rec.decision == "speak" else 0.0
        pb = pump.playback
        if pb is None:
            return
        rec.playback_delay_s = pb.sink.queue.delay_s
        counts = pb.sink.queue.counts.as_ms(pb.sink.rate)
        last = self._last_counts or dict.fromkeys(counts, 0.0)
        rec.playback_gaps = int(counts["gap_events"] - last["gap_events"])
        rec.playback_gap_ms = round(counts["gap_ms"] - last["gap_ms"], 3)
        rec.dropped_speech_ms = round(counts["dropped_speech_ms"] - last["dropped_speech_ms"], 3)
        self._last_counts = counts
        self.totals["gap_events"] += rec.playback_gaps
        self.totals["gap_ms"] += rec.playback_gap_ms
        self.totals["dropped_speech_ms"] += rec.dropped_speech_ms
        if rec.dropped_speech_ms:
            self.event.emit("late", f"dropped {rec.dropped_speech_ms:.0f} ms of late speech to keep the delay "
                                    f"at {pb.sink.queue.delay_s:.1f} s (+1 s at most)")
