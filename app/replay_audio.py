"""Replays play their audio: the recorded conversation through the default output device.

:func:`conversation` mixes what a replayed session heard and said on one timeline: the microphone as
recorded, and the model's speech one second later (the answer to input second k plays during second k+1,
as it did live). :class:`ReplayPlayer` is a Play/Stop button over it; its output callback only copies from
the mixed array (cf. app/audio_io.py), and a timer reports the position (``position``, seconds; -1 when
stopped) so the view can mark it. Without PortAudio or an output device the button is disabled and its
tooltip says why (one line).
"""
from __future__ import annotations

import threading
from typing import Callable, Optional, Tuple

import numpy as np
from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QPushButton

from app.audio_io import AudioUnavailable, sounddevice_module


def conversation(session) -> Optional[Tuple[np.ndarray, int]]:
    """([N] float32, rate): the microphone plus the model's speech one second later; None without audio."""
    ins, outs = session.input_audio, session.output_audio
    if ins is None and outs is None:
        return None
    rate = (ins or outs)[1]
    a = ins[0] if ins is not None else np.zeros(0, np.float32)
    b = outs[0] if outs is not None and outs[1] == rate else np.zeros(0, np.float32)
    b = np.r_[np.zeros(rate, np.float32), b] if len(b) else b
    mix = np.zeros(max(len(a), len(b)), np.float32)
    mix[:len(a)] += a
    mix[:len(b)] += b
    return np.clip(mix, -1.0, 1.0), int(rate)


def _default_stream(rate: int, callback):
    sd = sounddevice_module()
    try:
        return sd.OutputStream(samplerate=rate, channels=1, dtype="float32", callback=callback)
    except Exception as e:   # PortAudioError and friends: one line
        raise AudioUnavailable(f"cannot open the default output device: {e}") from None


class ReplayPlayer(QPushButton):
    """Play / Stop the replayed session's conversation on the default output device."""

    position = Signal(float)

    def __init__(self, session, open_stream: Callable = _default_stream, parent=None):
        super().__init__("▶ Play", parent)
        self.audio = conversation(session)
        self._open = open_stream
        self._stream = None
        self._pos = 0
        self._lock = threading.Lock()
        self._timer = QTimer(self, interval=100)
        self._timer.timeout.connect(self._tick)
        self.clicked.connect(self.toggle)
        self.setEnabled(self.audio is not None)
        self.setToolTip("play the recorded conversation (the microphone, and the model's speech as it played)"
                        if self.audio is not None else "this export has no recorded audio")

    @property
    def playing(self) -> bool:
        return self._stream is not None

    def toggle(self) -> None:
        self.stop() if self.playing else self.play()

    def play(self) -> bool:
        """Start playing from the beginning; on a missing device, disable the button with the reason."""
        if self.audio is None:
            return False
        self._pos = 0
        try:
            self._stream = self._open(self.audio[1], self._callback)
            self._stream.start()
        except AudioUnavailable as e:
            self._stream = None
            self.setEnabled(False)
            self.setToolTip(str(e))
            return False
        self.setText("■ Stop")
        self._timer.start()
        return True

    def _callback(self, outdata, frames, when, status) -> None:
        x = self.audio[0]
        with self._lock:
            take = x[self._pos:self._pos + frames]          # copies only
            self._pos += frames
        outdata[:len(take), 0] = take
        outdata[len(take):, 0] = 0.0

    def _tick(self) -> None:
        with self._lock:
            pos = self._pos
        if pos >= len(self.audio[0]):
            self.stop()
            return
        self.position.emit(pos / self.audio[1])

    def stop(self) -> None:
        self._timer.stop()
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close(ignore_errors=True)
            except TypeError:
                stream.close()
        self.setText("▶ Play")
        self.position.emit(-1.0)
