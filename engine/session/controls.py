"""The user's controls that reach the engine: force-listen, as a small value beside the toggles.

:class:`Controls` is frozen (a change is a new value, like :class:`engine.core.toggles.Toggles`); a
:class:`ControlledSession` holds the latest request and takes it at its next second, so a control asked
during second k is in effect from second k + 1 and its record says so (``SecondRecord.force_listen``).

Force-listen holds the model to listening. A backbone whose entry declares ``force_listen`` (MiniCPM-o 4.5:
the duplex page's Force Listen) gets it every second the control is on: that second listens whatever its LLM
would draw, a reply still open is closed with ``<|turn_eos|>`` and token2wav restarts
(``DuplexSession.process(force_listen=True)``); its voice activity is left as heard, as on the page. Any
other backbone hears every second as the user holding the floor (its voice activity reads speech, so a
voice-activity turn policy never starts a reply), and should its decision still be to speak, what it says
is not played (the second's output is silence). Either way the second's record says it was forced
(``SecondRecord.force_listen``). The app's runner builds sessions of this class
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
        if self._session.controls.force_listen and not self._session.backbone_forces:
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

    @property
    def backbone_forces(self) -> bool:
        """Whether the backbone takes a forced listen of its own (its entry declares ``force_listen``)."""
        return self.parts.force_listen

    def set_controls(self, controls: Controls) -> None:
        """Effective from the next second (thread-safe)."""
        if not isinstance(controls, Controls):
            raise TypeError(f"set_controls takes a Controls value, got {type(controls).__name__}")
        with self._lock:
            self._asked = controls

    def process(self, frame, arrival: Optional[float] = None, backlog: int = 0,
                force_listen: bool = False) -> Tuple[np.ndarray, SecondRecord]:
        """One second under the controls in effect; ``force_listen`` as :meth:`DuplexSession.process` (a
        backbone without its own forced listen refuses it in one line; the control is what holds those)."""
        with self._lock:
            if self._asked is not None:
                self.controls, self._asked = self._asked, None
        held = self.controls.force_listen and self.backbone_forces
        out, rec = super().process(frame, arrival=arrival, backlog=backlog, force_listen=held or bool(force_listen))
        rec.force_listen = self.controls.force_listen or bool(force_listen)
        if rec.force_listen and rec.decision == "speak":
            out = np.zeros_like(out)          # the backbone decided to speak anyway: nothing of it plays
            rec.output_rms = 0.0
        return out, rec
