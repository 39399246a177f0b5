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
"""
from __future__ import annotations

import collections
import gc
import json
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal

from app.audio_io import ENGINE_RATE, FileInput, InputSource, Playback, SilentInput
from app.lifecycle import THREAD_FAILURES, new_journal, sessions_root
from app.monitor import AudioMonitor
from app.conversation import (DEFAULT_DELAY_S, MAX_INPUT_BACKLOG, ConversationControls,  # noqa: F401
                              UserControls, controlled_runner)
from app.pump import FramePump
from app.transcript import TRANSCRIPT, transcript_text
from engine.atomic import atomic_write
from engine.core.toggles import Toggles
from engine.session import ExportError, LiveError, LiveResult, LiveRunner, SessionConfig
from engine.session.export import audio_path_summary, to_csv, to_trace
from engine.session.input_rate import journal_copy
from engine.session.journal import (CSV, INPUT_WAV, OUTPUT_WAV, RECORDS, SESSION_FILES, SUMMARY, TRACE,
                                    SessionJournal, export_folder)
from engine.wavio import WavError, read_wav, write_wav

IDLE, STARTING, RUNNING, DRAINING, STOPPING = "idle", "starting", "running", "draining", "stopping"
def _rows_of(path: Path) -> List[dict]:
    """The records of a JSON Lines file as dicts (the transcript of a finished journal)."""
    import json
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class SessionController(ConversationControls, QObject):
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
        self._notice_shown = False
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

    def _playback(self, sink) -> Optional[Playback]:
        if sink is None:
            return None
        sink.queue.set_delay(self.controls.delay_s)
        return Playback(sink)

    def _submit(self, frame: np.ndarray) -> None:
        """Frame-pump thread: keep the second until its answer comes, hand it to the engine (never blocks).
        With MAX_INPUT_BACKLOG seconds already waiting the new second is dropped (counted): a slow engine
        never builds a backlog of live input (a WAV file's seconds and a scripted run's are all kept: they
        process every second of their input)."""
        no, self._frame_no = self._frame_no, self._frame_no + 1
        if self._bounded and self.runner.backlog() >= MAX_INPUT_BACKLOG:
            self.input_dropped += 1
            return
        self._heard.append(np.array(frame, dtype=np.float32, copy=True))
        self._heard_no.append(no)
        self._submitted += 1
        self.runner.submit(frame)

    @property
    def frames_in(self) -> int:
        """Input seconds the pump handed over (those dropped for the bound included)."""
        return self._frame_no

    @property
    def submitted(self) -> int:
        """Seconds of input handed to the engine in this session."""
        return self._submitted

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

    def _halt_audio(self) -> None:
        if self.pump is not None:
            self.pump.halt()
        for dev in (self.source, self.sink):
            if dev is not None:
                dev.stop()

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)

    # -- controls (GUI thread) -------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        """Forward to the runner; the records show them from the next second on."""
        if self.runner is not None and self.state in (STARTING, RUNNING):
            self.runner.set_toggles(toggles)
            self.event.emit("toggle", f"requested demand_sized={toggles.demand_sized} "
                                      f"graph_replay={toggles.graph_replay} (from the next second)")

    def set_push_to_talk(self, enabled: bool) -> None:
        self._push_to_talk = bool(enabled)
        if self.pump is not None:
            self.pump.push_to_talk = self._push_to_talk

    def press_talk(self, pressed: bool) -> None:
        if self.pump is not None:
            self.pump.press_talk(pressed)

    def replace_input(self, source: InputSource) -> None:
        """Switch the microphone of a running session (raises AudioUnavailable if it cannot open)."""
        if self.pump is None or self.state not in (STARTING, RUNNING):
            return
        if not (source.deferred and self.state == STARTING):     # else _on_ready starts it
            source.start()
        old, self.source = self.source, source
        self.pump.replace_source(source)
        old.stop()

    def replace_output(self, sink) -> None:
        """Switch (or, with None, mute) the speaker of a running session."""
        if self.pump is None or self.state not in (STARTING, RUNNING):
            return
        if sink is not None:
            sink.start()
        old, self.sink = self.sink, sink
        self.pump.playback = self._playback(sink)
        if old is not None:
            old.stop()

    # -- polling (GUI thread, never blocks) --------------------------------------------------
    def _tick(self) -> None:
        self._drain_results()
        if self.state == STARTING and getattr(self.runner, "session", None) is not None:
            self._on_ready()
        if self.state in (STARTING, RUNNING, DRAINING):
            self._check_threads()
        if self.state in (STARTING, RUNNING):
            self._check_devices()
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

    def _playing_out(self) -> bool:
        """After the last second: whether the speaker still plays what the last seconds queued. The sink is told
        that no more is coming (it plays the rest without waiting for its buffer delay); the session waits as
        long as that takes, plus a second, and then stops whatever is left."""
        pb = self.pump.playback if self.pump is not None else None
        left = pb.queued_s() if pb is not None else 0.0
        if left <= 0.0:
            return False
        now = time.monotonic()
        if self._playout_until is None:
            self._playout_until = now + left + 1.0
            play_out = getattr(pb.sink, "play_out", None)
            if play_out is not None:
                play_out()
        return now < self._playout_until

    def _finish_journal(self) -> None:
        if self.journal is None or self.journal.finished:
            return
        try:
            self.journal.finish(summary=audio_path_summary(self.journal.records), metadata=dict(self.session_info))
        except ExportError as e:
            self.failure = self.failure or str(e)
            self.message.emit("error", str(e))

    def _check_threads(self) -> None:
        """A dead frame pump, engine worker or audio thread stops the session with one message."""
        pump = self.pump
        if pump is not None and getattr(pump, "error", None):
            self.fail(pump.error)
        elif THREAD_FAILURES:
            self.fail(THREAD_FAILURES.popleft())
        elif self.state == RUNNING and not self.runner.running and self.runner.results.empty():
            self.fail("the engine stopped unexpectedly (its worker thread is gone)")

    def _drain_results(self) -> None:
        if self.runner is None:
            return
        while True:
            try:
                item = self.runner.results.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, LiveResult):
                self._on_result(item)
            elif isinstance(item, LiveError):
                if not self.records and self.state == STARTING and self._previous[1] is not None:
                    self.journal.discard()           # nothing heard: the last session stays the one shown
                    self.records, self.journal, self.session_info = self._previous
                    self.failed_start = True
                self.fail(item.message)

    def _on_result(self, res: LiveResult) -> None:
        rec = res.record
        notice = getattr(res, "notice", "")
        if notice and not self._notice_shown:     # the log keeps the first; the window's banner follows `notice`
            self._notice_shown = True
            self.event.emit("warning", notice)
        audio = np.asarray(res.audio, dtype=np.float32)
        self.records.append(rec)
        heard = self._heard.popleft() if self._heard else np.zeros(self.pump.rate, dtype=np.float32)
        frame_no = self._heard_no.popleft() if self._heard_no else rec.index
        pump = self.pump
        pump.model_speaking = rec.decision == "speak"
        ahead = None
        if pump.playback is not None and self.state in (RUNNING, DRAINING):   # input ended: still heard
            if pump.allows(frame_no):
                ahead = pump.playback.push(audio, frame_no)
                sink = pump.playback.sink
                if not getattr(sink, "_primed", True):    # buffering: it starts once the delay is queued
                    ahead = max(ahead, sink.queue.delay_s)
            else:                                 # made before the engine heard the barge-in: not played
                self.totals["ducked_s"] += len(audio) / ENGINE_RATE
                ahead = pump.playback.queued_s()
        delay = self.monitor.on_answer(rec.index, audio, ENGINE_RATE, ahead)
        if ahead is not None and delay == delay:         # played on a device and measured: into the records
            rec.mic_to_speaker_ms = round(delay, 3)
        self._fill_audio_path(rec)          # this second ran with the controls in effect; it carries the requests
        self._take_asked()                  # ... which are in effect from the next second
        try:
            self.journal.append(rec, journal_copy(heard, self.pump.rate), audio)   # 24 kHz on disk
        except ExportError as e:
            self.fail(f"{e}; the session stopped")
        self.notice.emit(notice)
        self.record.emit(rec)

    def _check_devices(self) -> None:
        failure = self.source.check()
        if failure and getattr(self.source, "bad_data", False):
            self.fail(f"{failure}; the session stopped there (everything before it is kept)")
            return
        if failure:
            self.message.emit("warning", f"{failure}; the session continues on silence — pick another "
                                         "input or a WAV file")
            self.event.emit("device", failure)
            self.replace_input(SilentInput(self.pump.rate))
        if self.sink is not None:
            failure = self.sink.check()
            if failure:
                self.message.emit("warning", f"{failure}; playback is off (output audio is still recorded)")
                self.event.emit("device", failure)
                self.replace_output(None)
        while self.pump.events:
            self.event.emit(*self.pump.events.popleft())

    def _emit_meters(self) -> None:
        pump, src, sink = self.pump, self.source, self.sink
        self.totals["input_dropped"] = self.input_dropped
        self.meters.emit({
            "totals": dict(self.totals),
            "echo": bool(pump.canceller is not None and pump.canceller.enabled),
            "echo_error": pump.echo_error,
            "starting": self.state == STARTING,
            "level_db": pump.level_db,
            "mic_open": pump.talking or not pump.push_to_talk,
            "xruns": src.xruns + src.ring.overflows + (sink.xruns if sink is not None else 0),
            "backlog": self.runner.backlog(),
            "playback_s": pump.playback.queued_s() if pump.playback is not None else 0.0,
            "output_db": pump.playback.playing_level_db() if pump.playback is not None else None,
            "barge_ins": pump.barge_ins,
            "submitted": self.submitted,
        })

    # -- results -----------------------------------------------------------------------------
    def input_audio(self) -> np.ndarray:
        """What the engine heard, second by second (24 kHz, 16-bit precision): the processed seconds."""
        return self._journal_wav(INPUT_WAV)

    def output_audio(self) -> np.ndarray:
        """The speech the model produced, second by second (24 kHz, 16-bit precision)."""
        return self._journal_wav(OUTPUT_WAV)

    def _journal_wav(self, name: str) -> np.ndarray:
        if self.journal is None or not (self.journal.directory / name).is_file():
            return np.zeros(0, dtype=np.float32)
        return read_wav(self.journal.directory / name)[0]

    def save_output(self, path) -> Path:
        """The model's speech as a WAV file, atomically (raises WavError naming the path on failure)."""
        if self.journal is None:
            return write_wav(path, np.zeros(0, dtype=np.float32), ENGINE_RATE)
        src = self.journal.directory / OUTPUT_WAV

        def write(f) -> None:
            with open(src, "rb") as g:
                shutil.copyfileobj(g, f, 1 << 20)
        return atomic_write(path, write, WavError)

    def export(self, directory) -> Dict[str, Path]:
        """Timing logs (CSV, JSON Lines, Chrome trace) and input/output WAVs into ``directory``: all
        of them or, on a failure, none (the folder is filled beside it, then renamed into place).
        Works during a session too (everything up to the last second). Raises ExportError with one
        message naming the path."""
        j = self.journal
        if j is None:
            raise ExportError(f"cannot export to {directory}: no session yet")
        records, meta = list(j.records), dict(self.session_info)
        rows = [r.to_dict() for r in records] if not j.finished else None

        def fill(tmp: Path) -> None:
            if j.finished:
                for name in SESSION_FILES:
                    if (j.directory / name).is_file():
                        shutil.copyfile(j.directory / name, tmp / name)
            else:
                for name in (RECORDS, INPUT_WAV, OUTPUT_WAV):
                    shutil.copyfile(j.directory / name, tmp / name)
                (tmp / CSV).write_text(to_csv(records), encoding="utf-8")
                (tmp / TRACE).write_text(to_trace(records, meta), encoding="utf-8")
                (tmp / SUMMARY).write_text(json.dumps(audio_path_summary(records), indent=2) + "\n", encoding="utf-8")
            lines = rows if rows is not None else _rows_of(tmp / RECORDS)
            (tmp / TRANSCRIPT).write_text(transcript_text(lines), encoding="utf-8")
        paths = export_folder(directory, fill)
        paths["transcript"] = Path(directory).expanduser() / TRANSCRIPT
        self.event.emit("export", f"wrote {len(paths)} files to {directory}")
        return paths

    def discard(self) -> None:
        """Delete the last session's journal (after it stopped)."""
        if self.journal is not None and self.state == IDLE:
            self.journal.discard()
            self.journal = None
