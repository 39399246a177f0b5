"""The live runner: one worker thread owns the session; the caller (a GUI, a paced file) never waits.

``submit`` appends a one-second frame to an unbounded FIFO and returns at once — frames queue while
the engine is late, none is dropped. The worker takes them in order, runs each second and puts a
:class:`LiveResult` (record + audio) on ``results``; a failure is a :class:`LiveError` there. Each
frame's arrival time travels with it, so the record says how long it waited behind a late second
and by how much its deadline (the next frame's arrival) was missed; the result says whether the
engine is catching up or cannot keep the cadence at all.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Deque, Optional, Tuple

import numpy as np

from engine.core.toggles import PendingToggles, Toggles

from .config import SessionConfig
from .records import SecondRecord, keep_up_notice
from .session import RATE, DuplexSession, check_frame

log = logging.getLogger("engine.session")


@dataclass
class LiveResult:
    """One second done: its record and the audio to play during the next second."""

    record: SecondRecord
    audio: np.ndarray
    keeps_up: bool = True      # recent seconds fit the cadence (a backlog will drain)
    notice: str = ""           # set when the engine cannot keep up
    speech: Optional[np.ndarray] = None   # what the tail produced this second (24 kHz, unlevelled), where known


@dataclass
class LiveError:
    """The session failed to start or to run a second; the worker has stopped."""

    message: str


class FrameInbox:
    """The caller's side of a runner: one-second frames queued without bound, results out, a worker thread.

    ``submit`` never blocks and never drops; ``stop`` asks the worker to finish the second in progress
    (with ``drain``: every queued second). :class:`LiveRunner` and the engine host's runners share it.
    """

    thread_name = "duplex-session"

    def __init__(self) -> None:
        self.results: "queue.Queue" = queue.Queue()
        self.ready = threading.Event()              # set once the session is built (or failed)
        self._frames: Deque[Tuple[np.ndarray, float]] = collections.deque()   # (frame, arrival), unbounded
        self._cv = threading.Condition()
        self._stop = False
        self._drain = False
        self._running = False
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Start the worker; returns at once. The session is built in the worker."""
        if self._thread is not None:
            raise RuntimeError("this runner was already started")
        self._running = True
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    @property
    def input_rate(self) -> int:
        """The rate of the frames ``submit`` takes: the session config's ``input_rate`` (24 kHz without one)."""
        return int(getattr(getattr(self, "cfg", None), "input_rate", RATE))

    def submit(self, frame, arrival: Optional[float] = None) -> None:
        """Queue one second of mono float32 audio at :attr:`input_rate` (``input_rate`` samples; another length
        is a ValueError in one line); ``arrival``: when it came in (default now)."""
        x = np.array(check_frame(frame, self.input_rate), dtype=np.float32, copy=True)
        with self._cv:
            self._frames.append((x, time.perf_counter() if arrival is None else float(arrival)))
            self._cv.notify()
        self._poke()

    def backlog(self) -> int:
        with self._cv:
            return len(self._frames)

    @property
    def running(self) -> bool:
        return self._running

    def _request_stop(self, drain: bool) -> None:
        with self._cv:
            self._stop = True
            self._drain = bool(drain)
            self._cv.notify()
        self._poke()

    def _poke(self) -> None:
        """Hook: wake whoever launches this runner's seconds (the worker waits on ``_cv`` already)."""

    def _run(self) -> None:
        raise NotImplementedError


class LiveRunner(FrameInbox):
    """Owns one worker thread and its :class:`DuplexSession` (built in the worker by :meth:`start`)."""

    def __init__(self, cfg: SessionConfig, session_factory=DuplexSession, log_notice: bool = True):
        super().__init__()
        self.cfg = cfg
        self._factory = session_factory
        self.log_notice = bool(log_notice)   # the first "cannot keep up" to the log (a GUI shows results' own)
        self.session: Optional[DuplexSession] = None
        self._toggles = PendingToggles(Toggles(cfg.demand_sized, cfg.graph_replay))

    def set_toggles(self, toggles: Toggles) -> None:
        """Applied at the next second boundary."""
        self._toggles.ask(toggles)

    def asked_toggles(self) -> Toggles:
        return self._toggles.asked

    def stop(self, timeout: float = 5.0, drain: bool = False) -> None:
        """Finish the second in progress (with ``drain``: every queued second) and stop the thread."""
        self._request_stop(drain)
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    # -- worker ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            session = self._factory(self.cfg)
            session.start()
            self.session = session
        except Exception as e:  # noqa: BLE001 - any failure goes to the caller as one message
            # bad input (a checkpoint, a missing package) is the caller's one line; only a bug logs a traceback
            expected = isinstance(e, (ValueError, OSError, ImportError, KeyError))
            log.log(logging.DEBUG if expected else logging.ERROR, "session start failed", exc_info=True)
            self.results.put(LiveError(f"cannot start the session: {e}"))
            self._running = False
            self.ready.set()
            return
        self.ready.set()
        try:
            self._loop(session)
        except ValueError as e:               # a model or an input the session refuses: its own line says why
            log.debug("session stopped", exc_info=True)
            self.results.put(LiveError(f"the session stopped: {e}"))
        except Exception as e:  # noqa: BLE001
            log.exception("session failed")
            self.results.put(LiveError(f"the session stopped: {type(e).__name__}: {e}"))
        finally:
            self._running = False

    def _next(self):
        with self._cv:
            while not self._frames and not self._stop:
                self._cv.wait(0.5)
            if self._stop and not (self._drain and self._frames):
                return None
            frame, arrival = self._frames.popleft()
            return frame, arrival, self._toggles.take(), len(self._frames)

    def _loop(self, session: DuplexSession) -> None:
        warned = False
        while True:
            item = self._next()
            if item is None:
                return
            frame, arrival, toggles, waiting = item
            if toggles is not None:
                session.set_toggles(toggles)
            audio, rec = session.process(frame, arrival=arrival, backlog=waiting)
            rec.backlog = self.backlog()
            notice = keep_up_notice(session.records)
            if notice and not warned and self.log_notice:
                log.warning(notice)
                warned = True
            self.results.put(LiveResult(rec, audio, not notice, notice, session.last_speech))
            if not self._frames and not self._stop:      # idle until the next frame: prepare its graphs
                session.ahead(stop=self._frame_waiting)

    def _frame_waiting(self) -> bool:
        """Whether the next frame (or a stop) is here: what the idle-time preparation stops for."""
        return bool(self._frames) or self._stop
