"""The session controller: microphone -> frame pump -> LiveRunner -> GUI signals and playback.

Threads (cf. Friture): the audio callbacks only copy into ring buffers; the frame pump (a worker
thread) assembles one-second frames and submits them to the :class:`engine.session.LiveRunner`,
whose own worker runs the engine. This object lives on the GUI thread and drains the runner's
results queue from a ``QTimer`` without ever blocking: results are re-emitted as typed signals and
their audio is queued for playback. Stopping the runner (which finishes the second in progress)
happens on a helper thread, so the GUI thread never waits on the engine — except in
:meth:`SessionController.shutdown`, which the window and the signal handlers call before the
process may go (so no engine or pump thread is ever destroyed while it runs).

Every processed second goes at once into the session's journal (records and both WAVs, see
:mod:`engine.session.journal`) under ``sessions_root()``; a session that ends in any way finishes
its journal, and an export copies it. A thread that dies (the frame pump, the engine worker, an
audio thread) stops the session with one error message.

This file holds the session's life (start, the timer's polling, finish, stop, shutdown); its parts live
beside it: the audio devices (app/session_audio.py), seconds in and results out (app/session_results.py),
the journal and exports (app/session_export.py), the user's controls (app/conversation.py). An embedded or
a remote engine is only a different runner (the factory; app/engine_panel.py makes remote ones).
"""
from __future__ import annotations

import collections
import gc
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from PySide6.QtCore import QObject, QTimer, Signal

from app.audio_io import ENGINE_RATE, FileInput, InputSource, SilentInput  # noqa: F401  (the app's names)
from app.lifecycle import THREAD_FAILURES, new_journal, sessions_root
from app.monitor import AudioMonitor
from app.conversation import (DEFAULT_DELAY_S, MAX_INPUT_BACKLOG, ConversationControls,  # noqa: F401
                              UserControls, controlled_runner)
from app.pump import FramePump
from app.session_audio import SessionAudio
from app.session_export import SessionExport
from app.session_results import SessionResults
from app.states import DRAINING, IDLE, RUNNING, STARTING, STOPPING  # noqa: F401  (ctl.IDLE and the others)
from engine.core.toggles import Toggles
from engine.session import SessionConfig
from engine.session.journal import SessionJournal


class SessionController(SessionAudio, SessionResults, SessionExport, ConversationControls, QObject):
    """Runs one live session at a time and reports it through signals (GUI thread only)."""

    record = Signal(object)          # SecondRecord, one per processed second
    info = Signal(dict)              # DuplexSession.info, once the session is built
    state_changed = Signal(str)      # IDLE / STARTING / RUNNING / DRAINING / STOPPING
    message = Signal(str, str)       # (level "error" | "warning" | "info", text) for the banner
    event = Signal(str, str)         # (kind, text) for the event log
    meters = Signal(dict)            # level_db, mic_open, xruns, backlog, playback_s, barge_ins
    notice = Signal(str)             # per second: "cannot keep up: …" while it cannot, else ""
    stopped = Signal()

    def __init__(self, runner_factory: Optional[Callable[[SessionConfig], object]] = None,
                 poll_ms: int = 40, parent=None, journal_root=None):
        super().__init__(parent)
        self.journal_root = Path(journal_root) if journal_root is not None else None
        self.scripted = False                        # scripted runs journal apart (sessions_root(scripted=True))
        self._bounded = True
        self._factory = runner_factory or controlled_runner
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self._tick)
        self.state = IDLE
        self.runner = None
        self.pump: Optional[FramePump] = None
        self.source: Optional[InputSource] = None
        self.sink = None
        self.records: List[object] = []
        self.journal: Optional[SessionJournal] = None    # records + heard/said WAVs, on disk each second
        self._heard: collections.deque = collections.deque()   # submitted frames not yet answered
        self._submitted = 0
        self.failure: Optional[str] = None          # why the session stopped on its own (an error)
        self._stopper: Optional[threading.Thread] = None
        self._drain_left = 0
        self._playout_until: Optional[float] = None  # monotonic: the end of the last seconds' playback at the latest
        self.session_info: Dict[str, object] = {}
        self._notice_shown = False
        self._unheard_said = False                   # the "still loading: not heard" warning was given
        self._push_to_talk = False
        self.monitor = AudioMonitor()                # waveforms and mic-to-speaker delay (app/monitor.py)
        self._previous = ([], None, {})              # the last session, kept while a new one starts
        self.failed_start = False                    # the last Start failed before any second: view kept
        self.controls = UserControls()               # in effect (the records say so from the next second)
        self._asked: Dict[str, object] = {}          # asked, taken when the next second comes in
        self._requests: List[str] = []               # requests made since the last record (into it)
        self._frame_no = 0                           # frames the pump handed over (dropped ones included)
        self.input_dropped = 0                       # input seconds dropped: the engine was behind
        self._last_counts = None                     # the playback queue's counts at the last record
        self._last_barge_ins = 0
        self._heard_no: collections.deque = collections.deque()   # pump frame number of each heard second
        self.totals = {"gap_events": 0, "gap_ms": 0.0, "dropped_speech_ms": 0.0, "input_dropped": 0,
                       "ducked_s": 0.0}

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, cfg: SessionConfig, source: InputSource, sink=None, max_seconds: Optional[int] = None) -> None:
        """Open the audio, then build the session in the runner's worker (returns at once).

        Devices open now, so a bad one is reported at once (AudioUnavailable; nothing is left
        running), but the engine hears nothing until its session is built: a device's input is
        discarded meanwhile and a file starts playing only then, so building the model never
        counts as a late second. With ``max_seconds`` the session finishes by itself after that
        many seconds of input.
        """
        if self.state != IDLE:
            raise RuntimeError("a session is already running; stop it first")
        self.failed_start = False
        root = self.journal_root or sessions_root(scripted=self.scripted)
        journal = new_journal(root, {"config": dict(vars(cfg))})  # ExportError
        self._previous = (self.records, self.journal, self.session_info)   # kept if this start fails
        self.records = []
        self._notice_shown = self._unheard_said = False
        self.session_info = {}
        self.failure = None
        self._heard.clear()
        self._heard_no.clear()
        self._submitted = self._frame_no = self.input_dropped = 0
        self._last_counts, self._last_barge_ins, self._asked, self._requests = None, 0, {}, []
        self.totals = dict.fromkeys(self.totals, 0)
        THREAD_FAILURES.clear()
        try:
            if not source.deferred:
                source.start()
            try:
                if sink is not None:
                    sink.start()
            except Exception:
                source.stop()
                raise
        except Exception:
            journal.discard()
            raise
        self.source, self.sink = source, sink
        self.journal = journal
        # a live input drops a second rather than build a backlog; a file or a scripted run keeps every second
        self._bounded = not isinstance(source, FileInput) and not self.scripted
        gc.freeze()          # see _on_ready: keep full collections off the live path
        try:
            self.runner = self._factory(cfg)
            self.runner.start()
        except Exception:
            self.runner = None
            self._halt_audio()
            self.journal.discard()
            self.records, self.journal, self.session_info = self._previous
            raise
        u = self.controls
        self.pump = FramePump(source, self._submit, self._playback(sink), sensitivity=u.sensitivity,
                              max_frames=max_seconds, echo=u.echo, rate=getattr(cfg, "input_rate", ENGINE_RATE))
        self.pump.push_to_talk = self._push_to_talk
        self.pump.accepting = False
        self.monitor.clear()
        self.pump.on_block, self.pump.on_frame = self.monitor.on_block, self.monitor.on_frame
        self.pump.on_played = self.monitor.on_played
        if u.force_listen:
            self._ask_engine_controls()
        self.pump.start()
        self._set_state(STARTING)
        self.event.emit("session", f"starting: {cfg.tail} tail, {cfg.backbone} backbone, size {cfg.size}, "
                                   f"input {source.label}, output {sink.label if sink else 'none'}")
        self._timer.start()

    def _on_ready(self) -> None:
        """The session is built: open the engine's ears (GUI thread, from the timer)."""
        # Move the model's and the GUI's long-lived objects out of the cyclic collector's way: a
        # full collection over them otherwise stalls every thread, the GUI and the engine alike,
        # for ~100 ms at random moments.
        gc.freeze()
        if self.source.deferred:
            self.source.start()
        self.pump.accepting = True
        force = self._asked.get("force_listen", self.controls.force_listen)
        if force:                                  # asked before the session was built: hand it over now
            self._ask_engine_controls(force)
        self.session_info = dict(self.runner.session.info)
        if self.pump.unheard_s > 0:
            self.event.emit("session", f"{self.pump.unheard_s:.1f} s of speech while the model loaded was not "
                                       "heard; listening from now")
        self._set_state(RUNNING)
        self.info.emit(dict(self.session_info))

    def stop(self) -> None:
        """Stop now: audio off, the runner finishes its second on a helper thread."""
        if self.state in (IDLE, STOPPING):
            return
        self._halt_audio()
        runner = self.runner
        # the worker finishes its second however long it takes (a shutdown waits for it)
        self._stopper = threading.Thread(target=lambda: runner.stop(timeout=600.0), name="runner-stop",
                                         daemon=True)
        self._stopper.start()
        self._set_state(STOPPING)

    def fail(self, message: str) -> None:
        """Stop the session because something broke; ``message`` is the one line that says what."""
        if self.failure is None:
            self.failure = message
            self.message.emit("error", message)
            self.event.emit("error", message)
        self.stop()

    def shutdown(self, timeout_s: float = 600.0) -> bool:
        """Stop the session and WAIT (blocking) until the engine and pump threads are gone and the
        journal is finished. For closing the window and for exit; returns False on a timeout."""
        if self.state == IDLE:
            return True
        self.stop()
        deadline = time.monotonic() + timeout_s
        while self.state != IDLE and time.monotonic() < deadline:
            if self._stopper is not None:
                self._stopper.join(0.05)
            self._tick()
        return self.state == IDLE

    def finish(self, timeout_s: float = 60.0) -> None:
        """Stop feeding input, let every submitted second finish (at most ``timeout_s``), then stop."""
        if self.state not in (STARTING, RUNNING):
            return
        self.pump.halt()
        self.source.stop()
        self._drain_left = int(timeout_s * 1000 / max(1, self._timer.interval()))
        self._playout_until = None
        self._set_state(DRAINING)

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)

    # -- controls (GUI thread) -------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        """Forward to the runner; the records show them from the next second on, and the record of the second
        they were asked in carries the request (``requests``, as a user control's)."""
        if self.runner is not None and self.state in (STARTING, RUNNING):
            self.runner.set_toggles(toggles)
            text = (f"demand-sized state {'on' if toggles.demand_sized else 'off'}, "
                    f"graph replay {'on' if toggles.graph_replay else 'off'}")
            self._requests.append(text)              # into the record of the second it was asked in
            self.event.emit("toggle", f"requested {text} (from the next second)")

    # -- polling (GUI thread, never blocks) --------------------------------------------------
    def _tick(self) -> None:
        self._drain_results()
        if self.state == STARTING and getattr(self.runner, "session", None) is not None:
            self._on_ready()
        if self.state in (STARTING, RUNNING, DRAINING):
            self._check_threads()
        if self.state in (STARTING, RUNNING):
            self._check_devices()
            self._check_unheard()
            self._emit_meters()
            if self.pump.done:
                self.finish(timeout_s=600.0)    # a slow engine still finishes every second it got
        if self.state == DRAINING:
            self._drain_left -= 1
            finished = len(self.records) >= self.submitted or not self.runner.running
            if self._drain_left <= 0 or (finished and not self._playing_out()):
                self.stop()
        if self.state == STOPPING and not self._stopper.is_alive():
            self._drain_results()
            self._timer.stop()
            if self.pump is not None:
                self.pump.halt(timeout=5.0)
            self.pump = self.runner = None     # let the model, the threads and the resamplers go
            gc.unfreeze()    # the session's objects may be collected again
            self._finish_journal()
            self._set_state(IDLE)
            self.event.emit("session", f"stopped after {len(self.records)} s")
            self.stopped.emit()

    def _check_threads(self) -> None:
        """A dead frame pump, engine worker or audio thread stops the session with one message."""
        pump = self.pump
        if pump is not None and getattr(pump, "error", None):
            self.fail(pump.error)
        elif THREAD_FAILURES:
            self.fail(THREAD_FAILURES.popleft())
        elif self.state == RUNNING and not self.runner.running and self.runner.results.empty():
            self.fail("the engine stopped unexpectedly (its worker thread is gone)")
