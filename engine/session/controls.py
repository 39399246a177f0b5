"""The user's controls that reach the engine: force-listen, as a small value beside the toggles.

:class:`Controls` is frozen (a change is a new value, like :class:`engine.core.toggles.Toggles`); a
:class:`ControlledSession` holds the latest request and takes it at its next second, so a control asked
during second k is in effect from second k + 1 and its record says so (``SecondRecord.force_listen``).

Force-listen holds the model to listening: the backbone hears every second as the user holding the floor
(its voice activity reads speech, so a voice-activity turn policy never starts a reply), and should a
backbone's own decision still be to speak (a real checkpoint's LLM decides by itself), what it says is
not played (the second's output is silence). The app's runner builds sessions of this class
(``LiveRunner(cfg, session_factory=ControlledSession)``). No Qt here.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from .records import SecondRecord
from .session import DuplexSession


@dataclass(frozen=True)
class Controls:
    """What the user asked of the engine beyond its optimizations."""

    force_listen: bool = False


class _ForcedVad:
    """The session's voice-activity detector, reading speech while force-listen is on."""

    def __init__(self, vad, session: "ControlledSession"):
        self._vad, self._session = vad, session

    def __call__(self, x):
        result = self._vad(x)
        if self._session.controls.force_listen:
            return dataclasses.replace(result, speech=True)
        return result

    def __getattr__(self, name):
        return getattr(self._vad, name)


class ControlledSession(DuplexSession):
    """A :class:`DuplexSession` that follows :class:`Controls` from the next second on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.controls = Controls()
        self._asked: Optional[Controls] = None
        self._lock = threading.Lock()
        self.vad = _ForcedVad(self.vad, self)

    def set_controls(self, controls: Controls) -> None:
        """Effective from the next second (thread-safe)."""
        if not isinstance(controls, Controls):
            raise TypeError(f"set_controls takes a Controls value, got {type(controls).__name__}")
        with self._lock:
            self._asked = controls

    def process(self, frame, arrival: Optional[float] = None, backlog: int = 0) -> Tuple[np.ndarray, SecondRecord]:
        with self._lock:
            if self._asked is not None:
                self.controls, self._asked = self._asked, None
        out, rec = super().process(frame, arrival=arrival, backlog=backlog)
        rec.force_listen = self.controls.force_listen
        if rec.force_listen and rec.decision == "speak":
            out = np.zeros_like(out)          # the backbone decided to speak anyway: nothing of it plays
            rec.output_rms = 0.0
        return out, rec
