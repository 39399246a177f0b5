"""Seconds in and results out (a mixin of :class:`app.controller.SessionController`).

The frame pump hands each second to :meth:`SessionResults._submit` (on its thread; a live input keeps at most
``MAX_INPUT_BACKLOG`` seconds waiting); the GUI timer drains the runner's results: each second's audio goes to
the speaker (unless a barge-in ducked it), its record gets the audio path's readouts, goes into the journal
with what the engine heard and said, and out as the ``record`` signal. A :class:`LiveError` stops the session
(a start that failed before any second keeps the last session shown).
"""
from __future__ import annotations

import queue

import numpy as np

from app.audio_io import ENGINE_RATE
from app.conversation import MAX_INPUT_BACKLOG
from app.states import DRAINING, RUNNING, STARTING
from engine.session import ExportError, LiveError, LiveResult
from engine.session.input_rate import journal_copy


class SessionResults:
    """The engine's side of the controller: seconds submitted, results drained and journaled."""

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
