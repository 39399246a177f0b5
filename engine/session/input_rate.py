"""The rate of a session's input frames, where frames are made: the default per backbone and the 24 kHz copy.

A session takes one-second frames at ``SessionConfig.input_rate``: 24 kHz, or the native rate a backbone
declares (``BackboneEntry.native_rate``: the stock loop's own input, handed to the backbone as is). Whoever makes
frames (``run`` from a WAV, the app from a microphone or a file, a remote client) makes them at that rate
with the project's resampler (soxr); :func:`default_input_rate` is the rate a new session starts with.

The journal's ``session_input.wav`` stays 24 kHz whatever the session heard (one rate for both WAVs, one
second = 24,000 samples on disk): :func:`journal_copy` brings a frame there, second by second.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from engine import registry
from engine.audio import SESSION_RATE, resample

from .config import check_input_rate  # noqa: F401  (the rule, for a config not resolved here: a remote one's)
from .journal import SessionJournal


def default_input_rate(backbone: str) -> int:
    """The rate a session of ``backbone`` starts with: its declared native rate where it has one (the stock's
    front end bit for bit), else 24 kHz (also for a name the registry does not know: the config refuses it)."""
    if backbone not in registry.backbone_names():
        return SESSION_RATE
    return registry.get_backbone(backbone).default_input_rate()


def chosen_input_rate(a) -> int:
    """A command line's ``--input-rate`` (``a.input_rate``), else its backbone's default."""
    rate = getattr(a, "input_rate", None)
    return default_input_rate(a.backbone) if rate is None else rate


def journal_copy(frame: np.ndarray, rate: int) -> np.ndarray:
    """One second heard at ``rate`` as the journal's 24 kHz second (``SESSION_RATE`` samples; as is at 24 kHz)."""
    x = np.asarray(frame, dtype=np.float32).reshape(-1)
    if int(rate) == SESSION_RATE:
        return x
    y = resample(x, int(rate), SESSION_RATE)
    if y.size != SESSION_RATE:                  # soxr rounds the length; the journal keeps whole seconds
        y = np.pad(y, (0, max(0, SESSION_RATE - y.size)))[:SESSION_RATE]
    return y


class InputRateJournal(SessionJournal):
    """A :class:`SessionJournal` whose heard seconds come at ``input_rate`` (set after ``create``): each is
    written as its 24 kHz :func:`journal_copy`; records, output and speech as they are."""

    input_rate = SESSION_RATE

    def append(self, record, heard: np.ndarray, said: np.ndarray, speech: Optional[np.ndarray] = None) -> None:
        super().append(record, journal_copy(heard, self.input_rate), said, speech=speech)
