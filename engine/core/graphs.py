"""The one graph runtime: every CUDA graph in the process is captured here, through the one gate.

Whoever captures — the executor (one graph per shape signature), a backbone (the LLM's layer graphs,
the TTS's per-length decode graphs), a batched step (the group LLM step) or a fast-path self-check — owns a
:class:`GraphRuntime`: a memory pool (dropped with its graphs, never reused) and counters; all runtimes of a
device warm up and capture on its one capture stream (:func:`capture_stream`). :meth:`GraphRuntime.capture` is
the only capture call, and it

* holds the process's capture lock (:data:`engine.core.gate.GATE`) for the capture: one capture at a time in
  the process;
* captures in ``"thread_local"`` mode on the device's one (non-blocking) capture stream, so a CUDA call by another
  thread (the app's audio thread, a profiler) cannot invalidate it, and never synchronizes the device or empties
  the allocator's cache for it;
* installs the random-number state of the session the thread is working for (:func:`working_for`),
  so the graph registers that session's generator state, not whatever another session left installed;
  eager draws in a session's concurrent second take :func:`session_generator`.

Replays are counted (:func:`launches`), so a second's graph launches can be reported next to its wall
time without a profiler. A replay only adds one to its runtime's own tally (no lock: a runtime is used by
one thread at a time); :func:`launches` sums the tallies of the live runtimes and of those gone.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import gc
import threading
import weakref
from typing import Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar

import torch

from . import yieldpoints
from .gate import GATE

T = TypeVar("T")
CAPTURE_MODE = "thread_local"
# Side streams (warm-ups and captures) come from torch's high-priority stream pool and are used only under the
# capture lock; a session's own stream comes from the default-priority pool. torch hands pooled streams out
# round-robin, so two owners can get one stream: if a capture's stream were also another thread's launch
# stream, that thread's kernels would land in (or invalidate) the capture. Keeping the two pools apart rules
# that out (engine.models.step_audio2.lanes does the same for the branches it forks inside a capture).
CAPTURE_PRIORITY = -1

#: the random state of the session the running code works for (:func:`working_for`): a context variable, so each of a
#: scheduler's greenlets (one per session's second or build, all on one thread) sees its own
_working_for: "contextvars.ContextVar[object]" = contextvars.ContextVar("duplexcadence_working_for", default=None)


class _Tally:
    """One runtime's counts, kept apart from it so they can still be added up once it is gone."""
    __slots__ = ("captures", "replays")

    def __init__(self):
        self.captures = 0
        self.replays = 0


# The registry: the tallies of live runtimes, the sum of the gone ones', and the gone ones not yet moved
# there. The lock guards the registry only (never a replay). A runtime's finalizer takes no lock — the
# collector may run it on a thread inside launches() — it only queues the tally (deque appends are atomic);
# whoever next takes the lock moves it from _live into _retired, so no count is lost or counted twice.
_registry_lock = threading.Lock()
_live: Set[_Tally] = set()
_retired = _Tally()
_gone: "collections.deque[_Tally]" = collections.deque()


@contextlib.contextmanager
def working_for(rng) -> Iterator[None]:
    """While the block runs, this code works for the session whose random state is ``rng`` (an object with
    ``installed()`` and ``generator``, e.g. the host's ``SessionRng``): captures install it, and eager draws
    take :func:`session_generator` from it. ``None``: no session (the defaults)."""
    token = _working_for.set(rng)
    try:
        yield
    finally:
        _working_for.reset(token)


def _installed() -> ContextManager:
    rng = _working_for.get()
    return rng.installed() if rng is not None else contextlib.nullcontext()


def between_captures() -> None:
    """A point between two captures of a long build: under a device's scheduler the build parks here, so the
    running sessions' seconds go first (:func:`engine.core.yieldpoints.slice_point`); alone nothing happens.
    Called where no capture or warm-up is open: on entering :meth:`GraphRuntime.capture` and
    :meth:`GraphRuntime.side`, and at the ends of a build's phases."""
    yieldpoints.slice_point()


def session_generator(device) -> Optional["torch.Generator"]:
    """The generator an eager draw on ``device`` takes: the hosted session's own CUDA state, when this
    thread works for one on CUDA (its seconds run concurrently with others', so the default generator
    is not its own); else None, the device's default generator, which a lone session seeds."""
    rng = _working_for.get()
    if rng is None or torch.device(device).type != "cuda":
        return None
    return rng.generator


def launches() -> Tuple[int, int]:
    """(captures, replays) of every runtime in the process so far, live or gone (never going down)."""
    with _registry_lock:
        _retire_gone()
        return (_retired.captures + sum(t.captures for t in _live),
                _retired.replays + sum(t.replays for t in _live))


# Who owns what the caching allocator holds: each runtime's pool id by the runtime's name (kept after the
# runtime is gone: pool ids are never reused), and each device's capture stream.
_pool_owner: Dict[Tuple[int, int], str] = {}
_stream_owner: Dict[int, List[str]] = {}


def owners() -> Tuple[Dict[Tuple[int, int], str], Dict[int, str]]:
    """(graph pool id -> runtime name, capture stream handle -> its name), for a memory map."""
    with _registry_lock:
        return dict(_pool_owner), {h: ", ".join(names) for h, names in _stream_owner.items()}


def _register(runtime: "GraphRuntime") -> _Tally:
    """A new tally for ``runtime``, counted by :func:`launches` while it lives and after."""
    tally = _Tally()
    with _registry_lock:
        _retire_gone()
        _live.add(tally)
    weakref.finalize(runtime, _gone.append, tally)
    return tally


def _retire_gone() -> None:
    """Move the tallies of collected runtimes into the retired sums (the caller holds the lock)."""
    while _gone:
        tally = _gone.popleft()
        _live.discard(tally)
        _retired.captures += tally.captures
        _retired.replays += tally.replays


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """No cyclic garbage collection while a capture is open: a collected CUDA graph (or tensor) frees device
    memory or destroys its executable graph, which a capture forbids — the capture is invalidated ("operation
    not permitted when stream is capturing (function reset)", seen on the H200 when an earlier owner's graphs
    were collected during a capture)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_capture_streams: Dict[int, "torch.cuda.Stream"] = {}


def capture_stream(device) -> "torch.cuda.Stream":
    """The one side stream of ``device`` on which every warm-up and capture runs (made once per process).

    Every use is under the capture lock, so one stream serves all runtimes: a stream per runtime would
    leave, on each of torch's pooled streams it cycles through, its own cuBLAS workspaces and its own
    cached blocks, which no other stream can reuse (measured on the H200: 1.7 GB held on 13 side streams
    by one MiniCPM-o session, docs/device-notes-session13.md)."""
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with _registry_lock:
        s = _capture_streams.get(index)
        if s is None:
            s = _capture_streams[index] = torch.cuda.Stream(index, priority=CAPTURE_PRIORITY)
            _stream_owner[int(s.cuda_stream)] = ["capture stream: warm-ups and captures"]
        return s


def record_on(x, stream: "torch.cuda.Stream") -> None:
    """Tell the caching allocator that ``stream`` uses the CUDA tensors in ``x`` (a tensor, or a tuple or list of
    them, nested): their blocks are not handed to another allocation until the work queued on ``stream`` so far
    is done."""
    if isinstance(x, torch.Tensor):
        if x.is_cuda:
            x.record_stream(stream)
    elif isinstance(x, (tuple, list)):
        for y in x:
            record_on(y, stream)


def release_cached(device) -> None:
    """Give the blocks the caching allocator holds free on ``device`` (dead graphs' pools included) back
    to the driver, under the capture lock (no capture is open anywhere while the cache is emptied); for
    the end of a session's build and of a fast-path self-check. Not for a second: it synchronizes the
    device. A no-op off CUDA."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return
    with GATE.capturing():
        torch.cuda.empty_cache()


class GraphRuntime:
    """One owner's graphs: its pool, its counters, the capture stream; captures pass the gate."""

    def __init__(self, device, name: str = ""):
        self.device = torch.device(device)
        self.name = name
        self._owner = name or "unnamed runtime"        # how the memory map names its pool
        self._stream: Optional[torch.cuda.Stream] = None
        self._pool = None
        self._tally = _register(self)

    @property
    def captures(self) -> int:
        """Graphs this runtime has captured."""
        return self._tally.captures

    @property
    def replays(self) -> int:
        """Graph launches through :meth:`replay`."""
        return self._tally.replays

    @property
    def stream(self) -> "torch.cuda.Stream":
        """The device's one capture stream (:func:`capture_stream`)."""
        if self._stream is None:
            self._stream = capture_stream(self.device)
        return self._stream

    @property
    def pool(self):
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            with _registry_lock:
                _pool_owner[tuple(int(x) for x in self._pool)] = self._owner
        return self._pool

    def drop_pool(self) -> None:
        """Forget the pool (its graphs are gone): the next capture starts a new one."""
        self._pool = None

    @contextlib.contextmanager
    def side(self) -> Iterator["torch.cuda.Stream"]:
        """Eager work (warm-ups) on the capture stream, ordered after and before the current stream, under the
        capture lock (the stream is every runtime's: only the lock's holder uses it)."""
        between_captures()
        with GATE.capturing():
            s, cur = self.stream, torch.cuda.current_stream(self.device)
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                yield s
            torch.cuda.current_stream(self.device).wait_stream(s)

    def capture(self, fn: Callable[[], T], generators: Sequence["torch.Generator"] = (),
                pool: bool = True) -> Tuple["torch.cuda.CUDAGraph", T]:
        """``fn`` captured into a new graph on the capture stream, under the gate; (graph, fn's outputs).

        ``generators``: extra generator states the graph registers (besides the default one, installed
        for the session this thread works for); ``pool=False``: the graph gets its own private pool.

        The capture is begun and ended here rather than with ``torch.cuda.graph``, whose entry
        synchronizes the whole device and empties the allocator's cache: with other sessions replaying
        beside the capture, that would stall all of them and hand their cached blocks back to the driver
        at every capture (a session build captures hundreds of graphs)."""
        between_captures()
        with GATE.capturing(), _installed(), _no_collection():
            graph = torch.cuda.CUDAGraph()
            for g in generators:
                graph.register_generator_state(g)
            s = self.stream
            s.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(s):
                out = _captured(graph, fn, self.pool if pool else None)
            torch.cuda.current_stream(self.device).wait_stream(s)
        self._tally.captures += 1
        return graph, out

    def replay(self, graph: "torch.cuda.CUDAGraph") -> None:
        """``graph`` launched; counted on this runtime's tally (no lock: this is the hot path)."""
        graph.replay()
        self._tally.replays += 1

    def count(self, replays: int) -> None:
        """``replays`` graphs of this runtime launched directly (``graph.replay()`` in a hot loop), counted."""
        self._tally.replays += int(replays)


def _captured(graph: "torch.cuda.CUDAGraph", fn: Callable[[], T], pool) -> T:
    """``fn`` run inside ``graph``'s capture on the current stream (``pool``: the pool to allocate from, or
    None for the graph's own); the capture is ended even when ``fn`` fails, and ``fn``'s error is the one
    raised (a failed capture's end reports only that the capture was invalidated)."""
    graph.capture_begin(*(() if pool is None else (pool,)), capture_error_mode=CAPTURE_MODE)
    try:
        out = fn()
    except BaseException:
        with contextlib.suppress(Exception):
            graph.capture_end()
        raise
    graph.capture_end()
    return out


# -- example inputs for warm-ups and captures ---------------------------------------------------------------
# Drawn from a private CPU generator, then copied: an example never draws from a session's generators
# (a CUDA draw here, while another thread's capture is open, is what "Offset increment outside graph
# capture" reports) and never moves anyone's random stream.
def example_randn(shape, device) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(0)).to(device)


def example_randint(high: int, shape, device) -> torch.Tensor:
    return torch.randint(0, int(high), tuple(shape), generator=torch.Generator().manual_seed(0)).to(device)
