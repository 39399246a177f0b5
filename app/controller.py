"""The session controller: microphone -> frame pump -> LiveRunner -> GUI signals and playback.

Threads (cf. Friture): the audio callbacks only copy into ring buffers; the frame pump (a worker
thread) assembles one-second frames and submits them to the :class:`engine.session.LiveRunner`,
whose own worker runs the engine. This object lives on the GUI thread and drains the runner's
results queue from a ``QTimer`` without ever blocking: results are re-emitted as typed signals and
their audio is queued for playback. Stopping the runner (which finishes the second in progress)
happens on a helper thread, so the GUI thread never waits on the engine.
"""
from __future__ import annotations

import gc
import queue
import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal

from app.audio_io import ENGINE_RATE, InputSource, Playback, SilentInput
from app.monitor import AudioMonitor
from app.pump import FramePump
from engine.wavio import WavSpool, write_wav
from engine.session import LiveError, LiveResult, LiveRunner, SessionConfig, export_records

IDLE, STARTING, RUNNING, DRAINING, STOPPING = "idle", "starting", "running", "draining", "stopping"


class SessionController(QObject):
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
                 poll_ms: int = 40, parent=None):
        super().__init__(parent)
        self._factory = runner_factory or LiveRunner
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self._tick)
        self.state = IDLE
        self.runner = None
        self.pump: Optional[FramePump] = None
        self.source: Optional[InputSource] = None
        self.sink = None
        self.records: List[object] = []
        self._input: Optional[WavSpool] = None      # what the engine heard (24 kHz)
        self._output: Optional[WavSpool] = None     # what the model said (24 kHz)
        self._stopper: Optional[threading.Thread] = None
        self._drain_left = 0
        self.session_info: Dict[str, object] = {}
        self._notice_shown = False
        self._push_to_talk = False
        self.monitor = AudioMonitor()                # waveforms and mic-to-speaker delay (app/monitor.py)

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
        self.records = []
        self._notice_shown = False
        self.session_info = {}
        if not source.deferred:
            source.start()
        try:
            if sink is not None:
                sink.start()
        except Exception:
            source.stop()
            raise
        self.source, self.sink = source, sink
        for spool in (self._input, self._output):
            if spool is not None:
                spool.close()
        self._input, self._output = WavSpool(ENGINE_RATE), WavSpool(ENGINE_RATE)
        gc.freeze()          # see _on_ready: keep full collections off the live path
        try:
            self.runner = self._factory(cfg)
            self.runner.start()
        except Exception:
            self.runner = None
            self._halt_audio()
            raise
        self.pump = FramePump(source, self._submit, Playback(sink) if sink is not None else None,
                              max_frames=max_seconds)
        self.pump.push_to_talk = self._push_to_talk
        self.pump.accepting = False
        self.monitor.clear()
        self.pump.on_block, self.pump.on_frame = self.monitor.on_block, self.monitor.on_frame
        self.pump.start()
        self._set_state(STARTING)
        self.event.emit("session", f"starting: {cfg.tail} tail, {cfg.backbone} backbone, size {cfg.size}, "
                                   f"input {source.label}, output {sink.label if sink else 'none'}")
        self._timer.start()

    def _submit(self, frame: np.ndarray) -> None:
        """Frame-pump thread: keep the second for export, hand it to the engine (never blocks)."""
        self._input.append(frame)
        self.runner.submit(frame)

    @property
    def submitted(self) -> int:
        """Seconds of input handed to the engine in this session."""
        return self._input.samples // ENGINE_RATE if self._input is not None else 0

    def _on_ready(self) -> None:
        """The session is built: open the engine's ears (GUI thread, from the timer)."""
        # Move the model's and the GUI's long-lived objects out of the cyclic collector's way: a
        # full collection over them otherwise stalls every thread, the GUI and the engine alike,
        # for ~100 ms at random moments.
        gc.freeze()
        if self.source.deferred:
            self.source.start()
        self.pump.accepting = True
        self.session_info = dict(self.runner.session.info)
        self._set_state(RUNNING)
        self.info.emit(dict(self.session_info))

    def stop(self) -> None:
        """Stop now: audio off, the runner finishes its second on a helper thread."""
        if self.state in (IDLE, STOPPING):
            return
        self._halt_audio()
        runner = self.runner
        self._stopper = threading.Thread(target=runner.stop, name="runner-stop", daemon=True)
        self._stopper.start()
        self._set_state(STOPPING)

    def finish(self, timeout_s: float = 60.0) -> None:
        """Stop feeding input, let every submitted second finish (at most ``timeout_s``), then stop."""
        if self.state not in (STARTING, RUNNING):
            return
        self.pump.halt()
        self.source.stop()
        self._drain_left = int(timeout_s * 1000 / max(1, self._timer.interval()))
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
    def set_toggles(self, demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> None:
        """Forward to the runner; the records show them from the next second on."""
        if self.runner is not None and self.state in (STARTING, RUNNING):
            self.runner.set_toggles(demand_sized=demand_sized, graph_replay=graph_replay)
            self.event.emit("toggle", f"requested demand_sized={demand_sized} graph_replay={graph_replay} "
                                      "(from the next second)")

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
        self.pump.playback = Playback(sink) if sink is not None else None
        if old is not None:
            old.stop()

    # -- polling (GUI thread, never blocks) --------------------------------------------------
    def _tick(self) -> None:
        self._drain_results()
        if self.state == STARTING and getattr(self.runner, "session", None) is not None:
            self._on_ready()
        if self.state in (STARTING, RUNNING):
            self._check_devices()
            self._emit_meters()
            if self.pump.done:
                self.finish(timeout_s=600.0)    # a slow engine still finishes every second it got
        if self.state == DRAINING:
            self._drain_left -= 1
            if len(self.records) >= self.submitted or self._drain_left <= 0 or not self.runner.running:
                self.stop()
        if self.state == STOPPING and not self._stopper.is_alive():
            self._drain_results()
            self._timer.stop()
            self.pump = self.runner = None     # let the model, the threads and the resamplers go
            gc.unfreeze()    # the session's objects may be collected again
            self._set_state(IDLE)
            self.event.emit("session", f"stopped after {len(self.records)} s")
            self.stopped.emit()

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
                self.message.emit("error", item.message)
                self.event.emit("error", item.message)
                self.stop()

    def _on_result(self, res: LiveResult) -> None:
        rec = res.record
        notice = getattr(res, "notice", "")
        if notice and not self._notice_shown:
            self._notice_shown = True
            self.message.emit("warning", notice)
        audio = np.asarray(res.audio, dtype=np.float32)
        self.records.append(rec)
        self._output.append(audio)
        pump = self.pump
        pump.model_speaking = rec.decision == "speak"
        ahead = None
        if pump.playback is not None and self.state == RUNNING:
            ahead = pump.playback.push(audio)
        self.monitor.on_answer(rec.index, audio, ENGINE_RATE, ahead)
        self.notice.emit(notice)
        self.record.emit(rec)

    def _check_devices(self) -> None:
        failure = self.source.check()
        if failure:
            self.message.emit("warning", f"{failure}; the session continues on silence — pick another "
                                         "input or a WAV file")
            self.event.emit("device", failure)
            self.replace_input(SilentInput(ENGINE_RATE))
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
        self.meters.emit({
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
        """The session's microphone input as submitted to the engine (24 kHz, 16-bit precision)."""
        return self._input.read() if self._input is not None else np.zeros(0, dtype=np.float32)

    def output_audio(self) -> np.ndarray:
        """The speech the model produced, second by second (24 kHz, 16-bit precision)."""
        return self._output.read() if self._output is not None else np.zeros(0, dtype=np.float32)

    def save_output(self, path) -> Path:
        """The model's speech as a WAV file (raises WavError naming the path on failure)."""
        if self._output is None:
            return write_wav(path, np.zeros(0, dtype=np.float32), ENGINE_RATE)
        return self._output.save(path)

    def export(self, directory, stem: str = "session") -> Dict[str, Path]:
        """Timing logs (CSV, JSON Lines, Chrome trace) and input/output WAVs into ``directory``.

        Raises ExportError / WavError with one message naming the path that could not be written.
        """
        directory = Path(directory)
        paths = dict(export_records(list(self.records), directory, stem=stem, metadata=self.session_info or None))
        empty = np.zeros(0, dtype=np.float32)
        for key, spool in (("input_wav", self._input), ("output_wav", self._output)):
            path = directory / f"{stem}_{key[:-4]}.wav"
            paths[key] = spool.save(path) if spool is not None else write_wav(path, empty, ENGINE_RATE)
        self.event.emit("export", f"wrote {len(paths)} files to {directory}")
        return paths
