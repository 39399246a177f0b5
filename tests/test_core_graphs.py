"""The process's one gate and the one graph runtime (engine.core.gate, engine.core.graphs), on the CPU.

What CUDA itself would do with a capture is checked on the GPU (tests/test_host_gpu.py); here: the
gate's re-entrancy, the upgrade of a shared hold (a lazy capture inside a concurrent second), two
upgrades at once without a deadlock, writer preference, that example inputs and the session
generator never touch anyone's random stream, and the runtimes' counts (summed over live and gone
runtimes, no lock on a replay) through a fake torch.cuda."""
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


def test_gate_is_reentrant_for_its_writer():
    g = Gate()
    with g.exclusive():
        assert g.holds() == "exclusive"
        with g.exclusive(), g.shared():
            assert g.holds() == "exclusive"
        assert g.holds() == "exclusive"
    assert g.holds() == ""


def test_shared_hold_is_upgraded_and_taken_again():
    g, order = Gate(), []
    reader_in, release = threading.Event(), threading.Event()

    def other_reader():
        with g.shared():
            reader_in.set()
            release.wait(5)
            order.append("other reader done")

    t = threading.Thread(target=other_reader)
    t.start()
    reader_in.wait(5)
    with g.shared():
        assert g.holds() == "shared"
        threading.Timer(0.2, release.set).start()
        with g.exclusive():                          # waits for the other reader, not for itself
            order.append("upgraded")
            assert g.holds() == "exclusive" and g._readers == 0
        assert g.holds() == "shared" and g._readers == 1
    t.join(5)
    assert order == ["other reader done", "upgraded"]
    assert g.upgrades == 1 and g._readers == 0 and not g._writer


def test_two_readers_upgrading_at_once_take_turns():
    g, inside, order = Gate(), [], []
    both_shared = threading.Barrier(2)

    def reader(name):
        with g.shared():
            both_shared.wait(5)
            with g.exclusive():
                inside.append(name)
                assert len(inside) == 1, "two writers at once"
                time.sleep(0.05)
                inside.remove(name)
                order.append(name)

    ts = [threading.Thread(target=reader, args=(n,)) for n in "ab"]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert not any(t.is_alive() for t in ts), "deadlock: two upgrading readers"
    assert sorted(order) == ["a", "b"] and g.upgrades == 2


def test_waiting_writer_holds_new_readers_back():
    g, order = Gate(), []
    first_in, done = threading.Event(), threading.Event()

    def first():
        with g.shared():
            first_in.set()
            time.sleep(0.3)
            order.append("first reader")

    def writer():
        with g.exclusive():
            order.append("writer")

    def late_reader():
        with g.shared():
            order.append("late reader")
        done.set()

    t1 = threading.Thread(target=first)
    t1.start()
    first_in.wait(5)
    t2 = threading.Thread(target=writer)
    t2.start()
    time.sleep(0.1)                                   # the writer is waiting now
    t3 = threading.Thread(target=late_reader)
    t3.start()
    for t in (t1, t2, t3):
        t.join(5)
    assert order == ["first reader", "writer", "late reader"]


def test_the_process_has_one_gate():
    from engine.host.host import EngineHost
    assert EngineHost(device="cpu").gate is GATE


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
    def register_generator_state(self, g):
        pass

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
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(_HANDLES)))
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, **kw: contextlib.nullcontext())


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


def test_each_runtime_names_its_pool_and_side_stream_for_the_memory_map(fake_cuda, monkeypatch):
    """The memory map files a segment under the runtime whose pool or side stream holds it; the names stay
    after the runtime is gone (its cached blocks can outlive it)."""
    rt = graphs.GraphRuntime("cuda", "tts decode")
    rt.capture(lambda: None)
    pool, stream = tuple(rt.pool), rt.stream.cuda_stream
    other = graphs.GraphRuntime("cuda", "")
    other.capture(lambda: None)
    pools, streams = graphs.owners()
    assert pools[pool] == "tts decode" and streams[stream] == "tts decode"
    assert pools[tuple(other.pool)] == "unnamed runtime"
    one = _FakeStream()                         # torch's stream pool hands one stream to two runtimes
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: one)
    for name in ("tts decode", "llm layer graphs x1", "tts decode"):
        graphs.GraphRuntime("cuda", name).stream
    assert graphs.owners()[1][one.cuda_stream] == "tts decode, llm layer graphs x1"
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
