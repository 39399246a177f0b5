"""The paced feed shared by ``duplexcadence run``'s embedded and remote flows: progress, stop signals, and
the loop that submits frames to a runner and journals each second as it comes back.
"""
from __future__ import annotations

import contextlib
import queue
import signal
import sys
import time
from typing import Callable, List

import numpy as np

from engine.session import LiveError
from engine.session.journal import SessionJournal
from engine.signals import CaughtSignals
from engine.stats import progress as progress_bar


class Progress:
    """Seconds done as a progress bar on stderr (tqdm, refreshed every 10 s when stderr is not a terminal), with
    the last second's time and decision, and how late it was when it missed."""

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.quiet = total, quiet
        self.bar = None                     # drawn from the first second on (after the session's own messages)
        self.done = 0

    def update(self, done: int, rec) -> None:
        if self.bar is None:
            self.bar = progress_bar(self.total, desc="session", unit="s", quiet=self.quiet,
                                    mininterval=0.5 if sys.stderr.isatty() else 10.0)
        late = f"  MISSED by {rec.late_ms:.0f} ms" if rec.missed else ""
        self.bar.set_postfix_str(f"last {rec.total_ms:6.1f} ms {rec.decision}{late}", refresh=False)
        self.bar.update(done - self.done)
        self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def announce(info: dict) -> None:
    """Say what runs (and, loudly, when the weights are synthetic)."""
    print(f"session: {info['tail_title']} <- {info['backbone_title']} on {info['device']} ({info['size']})",
          file=sys.stderr)
    if info.get("voice"):
        print(f"voice: {info['voice']}", file=sys.stderr)
    if info.get("note"):
        print(f"NOTE: {info['note']}", file=sys.stderr)
    for line in info.get("fast_paths") or []:
        print(f"fast path: {line}", file=sys.stderr)


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while the session was being built (nothing to keep yet)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals(CaughtSignals):
    """SIGINT and SIGTERM stop the session at the next second boundary (while it is built: at once, by
    raising :class:`Interrupted`).

    Used as a context manager; the previous handlers come back on exit (outside the main thread none is
    installed). ``signum`` is the first signal received (0: none).
    """

    quiet_off_main_thread = True

    def __init__(self):
        super().__init__()
        self.building = True

    def _handle(self, signum, frame) -> None:
        super()._handle(signum, frame)
        if self.building:
            self.building = False            # once: a second signal must not break the clean-up
            raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self):
        """A block no signal breaks into: a worker thread's start (an Interrupted raised inside
        ``Thread.start``, before it has seen its thread run, leaves a running thread that ``is_alive`` denies
        and nothing joins; at exit the interpreter then tears it down with a traceback). A signal that came
        meanwhile raises :class:`Interrupted` after the block, where the caller can stop and join."""
        was, self.building = self.building, False
        try:
            yield
        finally:
            self.building = was
        if was and self.signum:
            self.building = False
            raise Interrupted(self.signum)


def feed(runner, frames: List[np.ndarray], progress: Progress, journal: SessionJournal, stop: StopSignals,
         due: Callable[[float, int], int], ended: str) -> None:
    """Submit ``frames`` to a started runner as ``due(elapsed_s, seconds_done)`` allows (frame k at t0 + k s
    in real time) and journal each second as it comes back; at a stop signal, the second in progress is kept.
    ``ended``: the message when the runner stops before the end of the input."""
    t0 = time.perf_counter()
    submitted = 0
    while journal.seconds < len(frames) and not stop.signum:
        while submitted < min(due(time.perf_counter() - t0, journal.seconds), len(frames)):
            runner.submit(frames[submitted])
            submitted += 1
        try:
            item = runner.results.get(timeout=0.02)
        except queue.Empty:
            if not runner.running and runner.results.empty():
                raise RuntimeError(ended)
            continue
        take(item, frames, journal, progress)
    runner.stop(timeout=60.0)                    # finishes the second in progress
    while not runner.results.empty():
        take(runner.results.get_nowait(), frames, journal, progress)


def take(item, frames: List[np.ndarray], journal: SessionJournal, progress: Progress) -> None:
    if isinstance(item, LiveError):
        raise RuntimeError(item.message)
    rec = item.record
    journal.append(rec, frames[rec.index], item.audio, speech=getattr(item, "speech", None))
    progress.update(journal.seconds, rec)
