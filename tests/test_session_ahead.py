"""The idle-time preparation between seconds: the session's ``ahead`` runs the config's scope (the TTS steps of a
reply past its prepared room by default) on a backbone whose entry declares that scope, the live worker runs it
only while no frame waits and hands it a ``stop`` that turns True the moment the next frame is here, and a bad
scope is one clear error."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from engine.session import DuplexSession, LiveResult, LiveRunner, SessionConfig
from engine.session.config import AHEADS

from runner_results import collect

FRAME = np.zeros(24000, np.float32)


def _cfg(**kw):
    return SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu", seed=3, **kw)


class _Prepares:
    """A backbone's ``prepare_ahead`` that records what it was asked and makes ``made`` captures."""

    def __init__(self, made: int = 3):
        self.calls, self.made = [], made

    def __call__(self, scope, stop):
        self.calls.append((scope, stop))
        return self.made


def test_session_ahead_runs_the_configured_scope_and_books_it_on_the_last_second():
    assert AHEADS[1] == "tts" and SessionConfig().ahead == "tts"       # the default: the TTS steps ahead
    s = DuplexSession(_cfg())
    s.start()
    prep = _Prepares()
    s.backbone.prepare_ahead = prep
    s.process(FRAME)
    assert s.parts.ahead == () and s.ahead() == 0.0 and prep.calls == []   # the synthetic one declares none
    s.records.clear()
    s.parts = dataclasses.replace(s.parts, ahead=("tts", "listen", "all"))
    assert s.ahead() == 0.0 and prep.calls == []                       # no second yet: nothing to prepare
    s.process(FRAME)
    assert s.ahead() > 0.0
    assert prep.calls == [("tts", None)]
    assert s.records[-1].ahead_captures == 3 and s.records[-1].ahead_ms > 0.0
    stop = lambda: False                                               # noqa: E731
    s.ahead("all", stop)
    assert prep.calls[-1] == ("all", stop) and s.records[-1].ahead_captures == 6
    s.cfg = s.cfg.replace(ahead="off")
    assert s.ahead() == 0.0 and len(prep.calls) == 2                   # "off": the backbone is not asked
    s.close()


def test_a_bad_ahead_scope_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown ahead 'sometimes'; choose one of: off, tts, listen, all"):
        _cfg(ahead="sometimes").resolved()
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    with pytest.raises(ValueError, match="ahead scope 'sometimes'"):
        MiniCPMO45Backbone.prepare_ahead(object.__new__(MiniCPMO45Backbone), "sometimes")


class _Watched(DuplexSession):
    """A session whose ``ahead`` records whether the next frame was waiting when it began, then holds until
    the test has submitted another frame and records ``stop()`` again (the worker's stop must see it)."""

    submitted = threading.Event()

    def __init__(self, cfg):
        super().__init__(cfg)
        self.seen = []

    def ahead(self, scope=None, stop=None):
        self.seen.append(("start", stop()))
        if len(self.seen) == 1:
            assert self.submitted.wait(30)
            self.seen.append(("after a frame came", stop()))
        return 0.0


def test_the_live_worker_prepares_only_while_idle_and_stops_for_the_next_frame():
    _Watched.submitted.clear()
    runner = LiveRunner(_cfg(), session_factory=_Watched)
    runner.start()
    assert runner.ready.wait(60)
    runner.submit(FRAME)
    first = collect(runner, 1)
    assert isinstance(first[0], LiveResult)                 # the second's result goes out before the preparation
    runner.submit(FRAME)
    _Watched.submitted.set()
    second = collect(runner, 1)
    runner.stop(timeout=10)
    assert isinstance(second[0], LiveResult) and second[0].record.index == 1
    seen = runner.session.seen
    assert seen[0] == ("start", False)                      # idle when it began
    assert seen[1] == ("after a frame came", True)          # the next frame turned stop() True
    assert all(s[0] == "start" and s[1] is False for s in seen[2:])
