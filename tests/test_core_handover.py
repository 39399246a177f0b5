"""A session build hands the capture lock to a running session that waits to capture (engine.core.gate), on the
CPU with a fake torch.cuda. Session 22 on the H200: whole MiniCPM-o sessions whose store grew while another session
was being built waited for the rest of that build in their THINK or LISTEN (5-12 s seconds, each ending when the
build ended): the build held the capture lock for all of its ~14 s. Whether CUDA agrees is for the GPU tests."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from engine.core import graphs
from engine.core.gate import GATE, Gate
from engine.host.rng import SessionRng

from tests.test_core_graphs import fake_cuda  # noqa: F401  (the fixture)


def _build(g: Gate, captures: int, step_s: float, log: list, started: threading.Event) -> None:
    with g.capturing(build=True):
        started.set()
        for _ in range(captures):
            g.let_waiters_capture()
            time.sleep(step_s)                                  # one capture's work
        log.append(("build done", time.perf_counter()))


def _waiter(g: Gate, log: list, build: bool = False) -> None:
    t = time.perf_counter()
    with g.capturing(build=build):
        log.append(("waiter in", time.perf_counter() - t))


def _run(hand_over: bool, waiter_is_build: bool = False, waiter=None, step_s: float = 0.02, g: Gate = None):
    """A build of 40 captures of ``step_s`` each and, once it holds the lock, a waiter (``waiter(g, log)``, default
    one capture) in a thread named hosted-session-7; (the gate, the log as a dict)."""
    g, log, started = g or Gate(), [], threading.Event()
    g.hand_over = hand_over
    b = threading.Thread(target=_build, args=(g, 40, step_s, log, started), name="builder")
    b.start()
    started.wait(5)
    time.sleep(0.05)
    w = threading.Thread(target=waiter or _waiter, args=(g, log) if waiter else (g, log, waiter_is_build),
                         name="hosted-session-7")
    w.start()
    w.join(10)
    b.join(10)
    return g, dict(log)


def test_a_waiting_capture_gets_the_lock_between_the_builds_captures():
    g, log = _run(hand_over=True)
    assert log["waiter in"] < 0.2 and g.handovers == 1                  # one capture's time, not the build's
    g, log = _run(hand_over=False)
    assert log["waiter in"] > 0.5 and g.handovers == 0                  # the old way: the whole build


def test_a_build_is_never_handed_another_builds_lock():
    """Two builds would each have their session's random state on the default generators: never interleaved."""
    g, log = _run(hand_over=True, waiter_is_build=True)
    assert log["waiter in"] > 0.5 and g.handovers == 0


def test_the_hand_over_keeps_the_builders_depth():
    g, got = Gate(), []
    g.hand_over = True
    with g.capturing(build=True), g.capturing():
        t = threading.Thread(target=lambda: (_waiter(g, got)))
        t.start()
        while not g.waiters_for_capture():
            time.sleep(0.001)
        assert g.let_waiters_capture()
        assert g.capture_depth() == 2 and got and got[0][0] == "waiter in"
        t.join(5)
    assert g.capture_depth() == 0 and g._capture_lock.acquire(blocking=False)
    g._capture_lock.release()


def test_suspended_puts_the_outer_state_back_and_keeps_both_streams():
    torch.manual_seed(5)
    outer_expected = torch.rand(3)
    torch.manual_seed(5)
    rng = SessionRng(torch.device("cpu"))
    with rng.installed():
        torch.manual_seed(9)
        a = torch.rand(2)
        with rng.suspended():
            outer = torch.rand(3)                               # the state that was on before the session's
        b = torch.rand(2)
    torch.manual_seed(9)
    assert torch.equal(torch.cat([a, b]), torch.rand(4))         # the session's stream, not skipped or rewound
    assert torch.equal(outer, outer_expected)
    with rng.suspended():                                        # outside installed(): nothing changes
        pass


def test_a_build_hands_over_at_a_capture_with_its_random_state_off(fake_cuda):  # noqa: F811
    """The builder (its session's state installed, as HostedSession.start does) captures graph after graph; a
    running session's capture comes in between, draws from its own state, and the builder's draws come out as
    if nothing had run between them."""
    before = GATE.hand_over
    GATE.hand_over = True
    try:
        torch.manual_seed(1)
        rng_a, rng_b = SessionRng(torch.device("cpu")), SessionRng(torch.device("cpu"))
        with rng_a.installed():
            torch.manual_seed(21)
        with rng_b.installed():
            torch.manual_seed(42)
        rt_a, rt_b = graphs.GraphRuntime("cpu", "builder"), graphs.GraphRuntime("cpu", "runner")
        drawn_a, drawn_b, started, waited = [], [], threading.Event(), []

        def builder():
            with graphs.working_for(rng_a), GATE.capturing(build=True), rng_a.installed():
                started.set()
                for _ in range(30):
                    rt_a.capture(lambda: drawn_a.append(torch.rand(1)))
                    time.sleep(0.01)

        def runner():
            with graphs.working_for(rng_b), GATE.shared():
                t = time.perf_counter()
                with rt_b.side():
                    torch.rand(5)                               # a warm-up's draw: whatever the default state is
                rt_b.capture(lambda: drawn_b.append(torch.rand(1)))
                waited.append(time.perf_counter() - t)

        tb = threading.Thread(target=builder)
        tb.start()
        started.wait(5)
        time.sleep(0.05)
        tr = threading.Thread(target=runner)
        tr.start()
        tr.join(5)
        tb.join(10)
        assert waited[0] < 0.3 and GATE.handovers >= 1
        torch.manual_seed(21)
        assert torch.equal(torch.cat(drawn_a), torch.rand(30))
        torch.manual_seed(42)
        assert torch.equal(drawn_b[0], torch.rand(1))
    finally:
        GATE.hand_over = before


@pytest.mark.parametrize("hand_over", [None, True, False])
def test_a_host_sets_hand_over_for_its_life_only(hand_over):
    """On by default (session 23, after the H200 runs), off when asked; the process's setting is back after."""
    from engine.host import EngineHost
    before = GATE.hand_over
    GATE.hand_over = not (hand_over is None or hand_over)       # the opposite of what the host should set
    try:
        h = EngineHost(device="cpu") if hand_over is None else EngineHost(device="cpu", hand_over=hand_over)
        assert GATE.hand_over is (hand_over is None or hand_over)
        h.close()
        assert GATE.hand_over is not (hand_over is None or hand_over)
    finally:
        GATE.hand_over = before


def test_a_minicpmo_build_offers_the_lock_at_the_end_of_each_phase(monkeypatch):
    """Session 23 (H200): with hand-overs only at capture entries, a running session's LISTEN that needed a capture
    still waited 6.5 s during a 5th build — the build's eager phases (stores, the prelude's feeds, the rehearsal)
    hold the lock with no capture in them. The build now offers the lock where each phase ends; here each offer
    is seen, in order (the hand-over itself: :func:`test_a_waiting_capture_gets_the_lock_between_the_builds_captures`)."""
    from engine.backbones.base import TokenFormat, make_backbone
    from engine.backbones.minicpmo45 import backbone as bb
    offers = []
    monkeypatch.setattr(bb, "between_captures", lambda: offers.append(len(offers)))
    fmt = TokenFormat(1, 6561, 25.0)
    b = make_backbone("minicpm-o-4.5", fmt, size="tiny", device="cpu", seed=3)
    b.start()
    assert len(offers) == 5          # executor, stores, graphs, before and after the rehearsal (no prelude: no folder)


def test_a_traced_gate_says_who_waited_for_whom_and_how_long():
    """``Gate.trace`` (a list): every wait of over a millisecond for the gate or the capture lock, every outermost
    capture-lock hold and every hand-over, as (thread name, what, start, end) — what a probe needs to tell which
    thread a stalled second waited for. Off (None), nothing is kept."""
    g = Gate()
    g.trace = []
    _run(False, g=g, step_s=0.005)
    spans = {(who, what): t1 - t0 for who, what, t0, t1 in g.trace}
    assert spans[("hosted-session-7", "wait capture lock")] > 0.1              # hand-over off: the whole build
    assert spans[("builder", "held capture lock (build)")] > 0.15
    assert ("hosted-session-7", "held capture lock") in spans
    g.trace = []
    _run(True, g=g, step_s=0.005)
    assert "handed the capture lock over" in [what for _, what, _, _ in g.trace]
    g.trace = None
    with g.capturing(), g.shared():
        pass
    assert g.trace is None


def test_a_waiter_with_several_captures_gets_them_in_one_offer():
    """A running second that needs several captures one after another (a TTS reply's per-length steps, each its own
    hold) takes them all at one offer of the build: the build hands the lock over again while the waiter asks again
    within a moment (for at most half a second an offer). One hand-over per capture would make those seconds wait
    for one build capture each (session 23's H200 run: two THINK seconds of 9 s during a build whose captures came
    at ~20 a second)."""
    def ten(g, log):
        t = time.perf_counter()
        for _ in range(10):
            with g.capturing():
                time.sleep(0.001)                               # a small capture
        log.append(("ten in", time.perf_counter() - t))
    g, got = _run(True, waiter=ten, step_s=0.03)
    assert got["ten in"] < 0.15, got                             # not ten of the build's 30 ms captures
    assert g.handovers >= 1
