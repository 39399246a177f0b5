"""The CUDA driver's work queues to a device: how many sessions' streams can run side by side.

The driver feeds a device through ``CUDA_DEVICE_MAX_CONNECTIONS`` hardware work queues: 8 unless the
environment says otherwise, at most 32. Streams are spread over the queues in turn, and the work of two
streams that land on one queue runs in the order it was issued although nothing orders it (a false
dependency). A host of many sessions gives each session its own stream, and a token2wav graph forks lanes of
its own inside each replay (engine.models.step_audio2.lanes): past 8 streams one session's small kernels wait
behind another's while the device has room for both.

The driver reads the setting once, when the process's CUDA context starts, so it has to be in the environment
before the first CUDA call; a request made later is refused with one line saying so, unless it asks for what is
already in effect. It decides which kernels may run side by side, never what any kernel computes: every
session's output keeps its bits (``duplexcadence-bench capacity --cuda-connections N`` checks every session
against itself alone).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
DRIVER_DEFAULT = 8          # what the driver opens when the environment names none
MOST = 32                   # the driver's ceiling

_started_with: Optional[int] = None     # the count the context started with, once we saw it start


class TooLate(RuntimeError):
    """CUDA has started with another queue count: the environment can no longer change it."""


def _from_env() -> int:
    raw = os.environ.get(ENV, "").strip()
    try:
        n = int(raw)
    except ValueError:
        return DRIVER_DEFAULT                       # unset or not a number: the driver keeps its default
    return min(max(n, 1), MOST)                     # the driver clamps to its range


def in_effect() -> int:
    """The queue count this process's CUDA context runs with (or will start with, if it has not started)."""
    global _started_with
    if _started_with is not None:
        return _started_with
    n = _from_env()
    if torch.cuda.is_initialized():
        _started_with = n                           # the environment as it was when we first saw CUDA up
    return n


def check(n: int) -> Optional[str]:
    """Why ``n`` is not a queue count the driver takes, or None."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MOST:
        return f"the CUDA work queue count must be a whole number from 1 to {MOST}, not {n!r}"
    return None


def add_option(parser, scope: str) -> None:
    """The ``--cuda-connections N`` option of a command that hosts sessions (``scope``: whose queues it sets)."""
    parser.add_argument("--cuda-connections", type=int, default=None, metavar="N",
                        help=f"{scope} CUDA work queues to the device, 1-{MOST} ({ENV}, set before CUDA starts; "
                             f"default: the environment's, else the driver's {DRIVER_DEFAULT}): past "
                             f"{DRIVER_DEFAULT} the sessions' streams share queues and wait behind each other")


def option_problem(n: Optional[int]) -> Optional[str]:
    """The one-line complaint about a ``--cuda-connections`` value (None: fine, or not given)."""
    why = None if n is None else check(n)
    return f"--cuda-connections: {why}" if why else None


def request(n: Optional[int]) -> int:
    """Ask for ``n`` work queues before CUDA starts (None: leave the environment as it is); returns the count
    the context runs with. Raises ValueError for a count out of range and :class:`TooLate` where CUDA already
    runs with another count."""
    if n is None:
        return in_effect()
    why = check(n)
    if why:
        raise ValueError(why)
    now = in_effect()
    if torch.cuda.is_initialized():
        if now != n:
            raise TooLate(f"CUDA already runs with {now} work queues; {ENV}={n} must be set before the process's "
                          f"first CUDA call (set it in the environment that starts the process)")
        return now
    os.environ[ENV] = str(n)
    return n
