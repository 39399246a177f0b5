"""The process's capture lock and the one graph runtime (engine.core.gate, engine.core.graphs), on the CPU.

What CUDA itself would do with a capture is checked on the GPU (tests/test_host_gpu.py); here: the lock's
re-entrancy and exclusion, the session each greenlet works for, that example inputs and the session generator
never touch anyone's random stream, and the runtimes' counts (summed over live and gone runtimes, no lock on a
replay) through a fake torch.cuda."""
from __future__ import annotations

import contextlib
import gc
import itertools
import threading
import time
import weakref

import pytest
import torch

from engine.core import graphs
from engine.core.gate import GATE, Gate


def test_the_capture_lock_is_reentrant_and_one_thread_holds_it_at_a_time():
    g, order = Gate(), []
    with g.capturing():
        assert g.holds() == "capturing" and g.capture_depth() == 1
        with g.capturing():
            assert g.capture_depth() == 2
        def other():
            with g.capturing():
                order.append("other")
        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.1)
        assert order == []                               # the other thread waits for the lock
        order.append("first")
    t.join(5)
    assert order == ["first", "other"] and g.holds() == ""


def test_each_greenlet_sees_its_own_session():
    """The session a greenlet works for is a context variable: two greenlets of one thread, switching inside
    their ``working_for`` blocks, each see their own (a thread-local would hand one's to the other)."""
    import greenlet
    seen = []

    def work(name):
        with graphs.working_for(name):
            greenlet.getcurrent().parent.switch()
            seen.append((name, graphs._working_for.get()))
    a, b = greenlet.greenlet(lambda: work("a")), greenlet.greenlet(lambda: work("b"))
    a.switch()
    b.switch()
    a.switch()
    b.switch()
    assert seen == [("a", "a"), ("b", "b")] and graphs._working_for.get() is None


def test_examples_draw_from_no_ones_stream():
    torch.manual_seed(7)
    before = torch.get_rng_state()
    a = graphs.example_randn((3, 4), "cpu")
    b = graphs.example_randint(10, (5,), "cpu")
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a, graphs.example_randn((3, 4), "cpu")) and int(b.max()) < 10 and a.std() > 0


def test_working_for_names_the_session_generator_and_nests():
    class Rng:
        def __init__(self):
            self.generator = torch.Generator()
            self.entered = 0

        @contextlib.contextmanager
        def installed(self):
            self.entered += 1
            yield

    r1, r2 = Rng(), Rng()
    assert graphs.session_generator("cpu") is None
    with graphs.working_for(r1):
        assert graphs.session_generator("cuda") is r1.generator
        assert graphs.session_generator("cpu") is None           # CPU seconds run exclusively: the default
        with graphs.working_for(r2):
            assert graphs.session_generator("cuda:0") is r2.generator
            with graphs._installed():
                pass
        assert graphs.session_generator("cuda") is r1.generator
    assert graphs.session_generator("cuda") is None
    assert (r1.entered, r2.entered) == (0, 1)


def test_session_rng_install_is_reentrant():
    from engine.host.rng import SessionRng
    torch.manual_seed(3)
    rng = SessionRng(torch.device("cpu"))
    outer = torch.get_rng_state()
    with rng.installed():
        torch.manual_seed(11)
        a = torch.rand(2)
        with rng.installed():                         # a capture inside the session's own second
            b = torch.rand(2)
        c = torch.rand(2)
    assert torch.equal(torch.get_rng_state(), outer)
    torch.manual_seed(11)
    assert torch.equal(torch.cat([a, b, c]), torch.rand(6))     # nothing rewound or skipped


class _FakeGraph:
    events = []                                      # ("begin", pool args, mode, gate hold) and ("end",)

    def register_generator_state(self, g):
        pass

    def capture_begin(self, *pool, capture_error_mode="global"):
        _FakeGraph.events.append(("begin", pool, capture_error_mode, GATE.holds()))

    def capture_end(self):
        _FakeGraph.events.append(("end",))

    def replay(self):
        pass


_HANDLES = itertools.count(1)


class _FakeStream:
    def __init__(self):
        self.cuda_stream = 0x1000 + next(_HANDLES)

    def wait_stream(self, other):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    """Just enough of torch.cuda for GraphRuntime.capture and replay to run their own code on the CPU."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, priority=0: _FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(_HANDLES)))
    monkeypatch.setattr(torch.cuda, "stream", lambda stream=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(graphs, "_capture_streams", {})            # a fake device's own capture stream
    for name in ("synchronize", "empty_cache", "graph"):           # a capture must call none of them
        monkeypatch.setattr(torch.cuda, name, _refused(name))
    _FakeGraph.events.clear()


def _refused(name):
    def call(*args, **kwargs):
        raise AssertionError(f"a capture called torch.cuda.{name}")
    return call


def _run(rt, captures, replays_each):
    for _ in range(captures):
        graph, _ = rt.capture(lambda: None)
        for _ in range(replays_each):
            rt.replay(graph)
    return graph


def test_launches_sum_every_runtime_and_keep_the_gone_ones(fake_cuda):
    cap0, rep0 = graphs.launches()
    runtimes = [graphs.GraphRuntime("cpu", name) for name in "abc"]
    graph = [_run(runtimes[i], i + 1, 10) for i in range(3)][0]
    assert [(r.captures, r.replays) for r in runtimes] == [(1, 10), (2, 20), (3, 30)]
    assert graphs.launches() == (cap0 + 6, rep0 + 60)
    tally, gone = runtimes[-1]._tally, weakref.ref(runtimes.pop())
    gc.collect()
    assert gone() is None
    assert graphs.launches() == (cap0 + 6, rep0 + 60)            # the gone runtime's counts stay
    assert tally not in graphs._live                              # ... moved to the retired sums, once
    runtimes[0].replay(graph)
    assert graphs.launches() == (cap0 + 6, rep0 + 61)


def test_replays_take_no_lock(fake_cuda, monkeypatch):
    """The hot path (~37 replays per LLM token) counts on its runtime only: every lock the module holds
    is swapped for one that fails when taken, and a thousand replays still go through."""
    class Refuses:
        def acquire(self, *args, **kwargs):
            raise AssertionError("a replay took a lock")
        __enter__ = acquire

        def __exit__(self, *exc):
            return False
        release = __exit__

    lock_types = (type(threading.Lock()), type(threading.RLock()))
    rt = graphs.GraphRuntime("cpu", "hot")
    graph, _ = rt.capture(lambda: None)
    cap0, rep0 = graphs.launches()
    with monkeypatch.context() as m:
        for name, value in list(vars(graphs).items()):
            if isinstance(value, lock_types):
                m.setattr(graphs, name, Refuses())
        for _ in range(1000):
            rt.replay(graph)
    assert rt.replays == 1000 and graphs.launches() == (cap0, rep0 + 1000)


def test_each_runtime_names_its_pool_and_all_share_one_capture_stream(fake_cuda, monkeypatch):
    """The memory map files a graph pool under its runtime's name (kept after the runtime is gone: its blocks
    can outlive it); every runtime of a device warms up and captures on the device's one capture stream, made
    once (a stream per runtime left cuBLAS workspaces and cached blocks on each pooled stream it touched)."""
    made = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, priority=0: made.append(priority) or _FakeStream())
    rt = graphs.GraphRuntime("cuda", "tts decode")
    rt.capture(lambda: None)
    pool, stream = tuple(rt.pool), rt.stream.cuda_stream
    other = graphs.GraphRuntime("cuda", "")
    other.capture(lambda: None)
    with other.side():
        pass
    pools, streams = graphs.owners()
    assert pools[pool] == "tts decode" and pools[tuple(other.pool)] == "unnamed runtime"
    assert other.stream is rt.stream and made == [graphs.CAPTURE_PRIORITY]
    assert streams[stream] == "capture stream: warm-ups and captures"
    for name in ("tts decode", "llm layer graphs x1"):
        assert graphs.GraphRuntime("cuda", name).stream is rt.stream
    assert made == [graphs.CAPTURE_PRIORITY]
    del rt
    gc.collect()
    assert graphs.owners()[0][pool] == "tts decode"


def test_no_cyclic_collection_while_a_capture_is_open():
    """A capture runs with the cyclic collector off (a graph collected mid-capture destroys its executable graph,
    which invalidates the capture: seen on the H200), and the collector's state comes back after, even on error."""
    from engine.core.graphs import _no_collection
    assert gc.isenabled()
    with _no_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with _no_collection():
            raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()                                   # a caller that had it off keeps it off
    try:
        with _no_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_capture_is_begun_and_ended_under_the_capture_lock_without_a_device_sync(fake_cuda):
    """GraphRuntime.capture holds the gate *capturing* (beside others' shared seconds), begins the capture in
    thread-local mode on the runtime's pool (or the graph's own), and neither synchronizes the device nor
    empties the allocator's cache (the fixture refuses both)."""
    rt = graphs.GraphRuntime("cuda", "t")
    seen = []
    rt.capture(lambda: seen.append(GATE.holds()))
    rt.capture(lambda: None, pool=False)
    assert seen == ["capturing"] and GATE.holds() == ""
    assert _FakeGraph.events == [("begin", (rt.pool,), "thread_local", "capturing"), ("end",),
                                 ("begin", (), "thread_local", "capturing"), ("end",)]


def test_a_failed_capture_is_ended_and_raises_its_own_error(fake_cuda, monkeypatch):
    rt = graphs.GraphRuntime("cuda", "t")

    def invalidated(self):
        _FakeGraph.events.append(("end",))
        raise RuntimeError("operation failed due to a previous error during capture")
    monkeypatch.setattr(_FakeGraph, "capture_end", invalidated)
    with pytest.raises(ValueError, match="the body failed"):
        rt.capture(lambda: (_ for _ in ()).throw(ValueError("the body failed")))
    assert _FakeGraph.events[-1] == ("end",) and rt.captures == 0
    assert GATE.holds() == "" and not GATE._capture_lock._is_owned() and gc.isenabled()


def test_capture_streams_never_come_from_the_pool_sessions_launch_on(monkeypatch):
    """torch hands pooled streams out round-robin, so two owners can share one: the capture stream and the
    lanes forked inside a capture come from the high-priority pool, used only under the capture lock; a
    session's stream and eager lanes from the default one. Side-stream work holds the gate capturing."""
    from engine.models.step_audio2 import lanes
    asked = []

    class Stream(_FakeStream):
        def __init__(self, device=None, priority=0):
            super().__init__()
            asked.append(priority)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(graphs, "_capture_streams", {})
    rt = graphs.GraphRuntime("cuda", "t")
    with rt.side():
        assert GATE.holds() == "capturing"
    assert asked == [graphs.CAPTURE_PRIORITY] and graphs.CAPTURE_PRIORITY < 0
    monkeypatch.setattr(lanes, "_local", threading.local())
    for capturing in (True, False):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda c=capturing: c)
        got = lanes._side_streams(torch.device("cuda"), 2)
        assert asked[-2:] == [graphs.CAPTURE_PRIORITY if capturing else 0] * 2 and len(got) == 2
    assert len({id(s) for k in lanes._local.pool for s in lanes._local.pool[k]}) == 4


def test_release_cached_empties_the_cache_under_the_capture_lock_on_cuda_only(monkeypatch):
    """The end of a build and of a fast-path check give the allocator's free blocks back (dead self-check
    graphs' pools, warm-ups' blocks) with no capture open anywhere; nothing happens off CUDA, and a verdict
    found in the cache runs nothing and releases nothing."""
    from engine import fastpath
    held = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: held.append(GATE.holds()))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    graphs.release_cached("cpu")
    assert held == []
    graphs.release_cached("cuda")
    assert held == ["capturing"]
    monkeypatch.setattr(fastpath, "cache_key", lambda path, device, config, code: (path, str(device)))
    monkeypatch.setattr(fastpath, "_cache", {})
    monkeypatch.setattr(fastpath, "_disk_get", lambda key: None)
    monkeypatch.setattr(fastpath, "_disk_put", lambda key, verdict: None)
    runs = []
    check = lambda: runs.append(1) or (True, "same bits")          # noqa: E731
    for _ in range(2):
        v = fastpath.decide("release test", "cuda", {"w": 1}, check, code=["x"])
        assert v.chosen
    assert runs == [1] and held == ["capturing", "capturing"]
