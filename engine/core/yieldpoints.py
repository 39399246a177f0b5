"""Where a session's second may hand the device's one scheduler the floor: batched steps, host reads, build slices.

A session's code runs the same whether it runs alone or under a device's scheduler (:mod:`engine.sched`): at a
few points it asks :func:`current` whether a *port* is bound — the scheduler binds one to every session's second
and build — and, where one is, hands the work to it instead of doing it in place:

* :func:`batched` — a step the backbone declares batchable (MiniCPM-o's one-token LLM forward): the scheduler
  parks the session there, runs the step once for every session parked at the same kind (over the same weights),
  and resumes each with its own result. Alone (no port, or the port declines), the caller runs its own step.
* :func:`wait` — the host is about to read something the device computes (a sampled token, the second's codes,
  the audio): under a scheduler the session parks until its own stream's work is done, and the scheduler launches
  the other sessions' work meanwhile; alone it returns at once (the read itself waits, as before).
* :func:`slice_point` — between two pieces of a long build (its graph captures): under a scheduler the build
  parks there so the running sessions' seconds go first; alone nothing happens.

Nothing here imports the scheduler: this module is the core's, and the scheduler is above it. The port is held
in a context variable, so each greenlet (one per session's second, :mod:`engine.sched.task`) sees its own.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Optional, Protocol


class Port(Protocol):
    """What a scheduler offers the code of the session it runs (see the module docstring)."""

    def batched(self, kind: str, group: object, member: object, payload: Any) -> Any:
        """Park until the step ``kind`` ran for every member of ``group`` parked at it; this member's result.
        Raises :class:`NotBatched` where the scheduler runs no such step for it (the caller runs its own)."""

    def prepare(self, kind: str, group: object, member: object) -> None:
        """In a build: whatever the batched step ``kind`` over ``group`` checks once (its start-up self-checks),
        made now, in the build's slices."""

    def wait(self) -> None:
        """Park until the work this session launched so far has finished on the device."""

    def slice_point(self) -> None:
        """A build's point between two captures: other sessions' work may run first."""


class NotBatched(Exception):
    """The port runs no batched step of this kind for this caller: it runs its own step."""


_port: "contextvars.ContextVar[Optional[Port]]" = contextvars.ContextVar("duplexcadence_port", default=None)


def current() -> Optional[Port]:
    """The port bound to the code running now (a scheduled session's second or build), or None: alone."""
    return _port.get()


@contextlib.contextmanager
def bound(port: Optional[Port]) -> Iterator[None]:
    """Bind ``port`` for the block (the scheduler binds one inside each of its greenlets)."""
    token = _port.set(port)
    try:
        yield
    finally:
        _port.reset(token)


def batched(kind: str, group: object, member: object, payload: Any) -> Optional[Any]:
    """The result of ``kind`` for ``member`` run by the scheduler together with the other members of ``group``
    parked at it; None where no port is bound or it runs no such step (the caller runs its own step)."""
    port = _port.get()
    if port is None:
        return None
    try:
        return port.batched(kind, group, member, payload)
    except NotBatched:
        return None


def prepare(kind: str, group: object, member: object) -> None:
    """In a scheduled build: make the batched step's start-up checks now (alone: nothing to prepare)."""
    port = _port.get()
    if port is not None:
        port.prepare(kind, group, member)


def wait() -> None:
    """Before a host read of device work: under a scheduler, park until this session's work is done."""
    port = _port.get()
    if port is not None:
        port.wait()


def slice_point() -> None:
    """Between two pieces of a build: under a scheduler, let the running sessions' seconds go first."""
    port = _port.get()
    if port is not None:
        port.slice_point()
