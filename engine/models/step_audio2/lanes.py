"""Independent pieces of one step's work on parallel CUDA streams ("lanes"), captured as parallel graph branches.

A chunk of token2wav is a long chain of small kernels that each leave most of an H200 idle (a 100 x 512 x
512 GEMM, a 64-channel convolution over 7,000 samples). Where the chain forks into work that does not depend
on itself (the q/k/v projections of one attention layer, the three residual blocks of a HiFT stage, the
NSF-source branch), :func:`parallel` issues each branch on its own stream and joins them back, so the GPU
runs them side by side. Every branch runs exactly the kernels it ran alone, on the same inputs: no output
bit changes, only the order in which independent kernels reach the GPU.

Under CUDA graph capture the fork (``wait_stream``) and the join become graph edges; the replay keeps them
parallel. The side streams are per thread and per device, and those forked inside a capture come from a
pool no other thread launches on outside the capture lock (a capture in one thread never meets another
thread's work on its streams). On the CPU, or when switched off, the branches run one after the other.

Memory: a tensor made on a side stream and read later on the calling stream is recorded on the calling
stream (``record_stream``), so the caching allocator does not hand its memory out again too early.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

import torch

from engine.core.graphs import CAPTURE_PRIORITY, record_on

T = TypeVar("T")

_local = threading.local()


def _side_streams(device: torch.device, n: int) -> List[torch.cuda.Stream]:
    """``n`` side streams of ``device`` for this thread (made once, then reused). Inside a capture they come
    from the capture runtime's high-priority pool (used only under the capture lock), else from the default
    pool: torch's pooled streams are shared round-robin, and a branch forked into a capture must never be on
    a stream another thread launches on (:data:`engine.core.graphs.CAPTURE_PRIORITY`)."""
    pool: Dict[Tuple[int, bool], List[torch.cuda.Stream]] = getattr(_local, "pool", None) or {}
    _local.pool = pool
    idx = device.index if device.index is not None else torch.cuda.current_device()
    capturing = torch.cuda.is_current_stream_capturing()
    have = pool.setdefault((idx, capturing), [])
    while len(have) < n:
        have.append(torch.cuda.Stream(device=idx, priority=CAPTURE_PRIORITY if capturing else 0))
    return have[:n]


def parallel(branches: Sequence[Callable[[], T]], device: torch.device, on: bool = True,
             first_lane: int = 0) -> List[T]:
    """Run ``branches`` (no arguments each; tensors or lists of tensors out) side by side; their results in order.

    ``branches[0]`` runs on the calling stream, the others each on a side stream (lanes ``first_lane``,
    ``first_lane + 1``, ...) that first waits for everything issued so far; the calling stream then waits
    for all of them. ``on=False`` or a non-CUDA
    device: one after the other, in order.
    """
    if not on or device.type != "cuda" or len(branches) < 2:
        return [b() for b in branches]
    main = torch.cuda.current_stream(device)
    sides = _side_streams(device, first_lane + len(branches) - 1)[first_lane:]
    outs: List[T] = [None] * len(branches)          # type: ignore[list-item]
    for s in sides:
        s.wait_stream(main)
    for i, (s, branch) in enumerate(zip(sides, branches[1:]), start=1):
        with torch.cuda.stream(s):
            outs[i] = branch()
    outs[0] = branches[0]()
    for s, out in zip(sides, outs[1:]):
        main.wait_stream(s)
        record_on(out, main)
    return outs


class Forked(Generic[T]):
    """A branch issued on a side stream by :func:`fork`; :meth:`join` hands its result to the calling stream."""

    def __init__(self, out: T, stream: Optional[torch.cuda.Stream] = None, main: Optional[torch.cuda.Stream] = None):
        self._out, self._stream, self._main = out, stream, main

    def join(self) -> T:
        """The calling stream waits for the branch; its result is then safe to use there (join once, always:
        a capture cannot end with a branch left open)."""
        if self._stream is not None:
            self._main.wait_stream(self._stream)
            record_on(self._out, self._main)
            self._stream = None
        return self._out


def fork(branch: Callable[[], T], device: torch.device, lane: int, on: bool = True) -> Forked[T]:
    """Issue ``branch`` on side stream number ``lane`` (after everything issued so far) and return at once;
    the caller goes on with other work and joins where it needs the result. ``on=False`` or a non-CUDA
    device: ``branch`` runs here and now. Branches on the same lane run one after the other."""
    if not on or device.type != "cuda":
        return Forked(branch())
    main = torch.cuda.current_stream(device)
    side = _side_streams(device, lane + 1)[lane]
    side.wait_stream(main)
    with torch.cuda.stream(side):
        out = branch()
    return Forked(out, side, main)
