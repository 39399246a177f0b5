"""GPU: exact-shape capture/replay over the arena equals eager bit for bit (run on the device)."""
import pytest
import torch

from engine.core import Executor, make_plan
from engine.models.toy import ToyStreamer
from engine.core.toggles import Toggles

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

DEV = "cuda"


def _setup(steps=None):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m = ToyStreamer().to(DEV)
    plan = make_plan(m.regions(m.spec(steps)), m.spec(steps))
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(1, m.c, m.clock.advance(k), generator=g).to(DEV) for k in range(60)]
    prompt = torch.randn(2, 1, m.h, m.prompt_frames, m.d, generator=g).to(DEV)
    return m, plan, xs, prompt


def _run(m, plan, xs, prompt, sched, ahead=False, debug=True):
    torch.manual_seed(5)
    ex = Executor(m, plan, DEV, **sched(0), debug=debug)
    if ahead:
        n = ex.prepare_graphs(lambda sp: m.example_inputs(sp, DEV))
        assert n == len(plan.signatures)
    ex.init_state({"kv": prompt})
    outs = []
    for k, x in enumerate(xs):
        ex.set_toggles(Toggles(**sched(k)))
        outs.append(ex.step({"x": x})["y"])
    torch.cuda.synchronize()
    return outs, ex


def test_ahead_of_time_graphs_equal_eager_bit_for_bit():
    m, plan, xs, prompt = _setup()
    ref, _ = _run(m, plan, xs, prompt, lambda k: {"demand_sized": True, "graph_replay": False})
    out, ex = _run(m, plan, xs, prompt, lambda k: {"demand_sized": True, "graph_replay": True}, ahead=True)
    assert ex.stats.captures == len(plan.signatures) and ex.stats.eager_steps == 0
    assert ex.stats.replayed_steps == len(xs)
    assert all(torch.equal(a, b) for a, b in zip(ref, out))


def test_lazy_capture_and_toggle_flips_equal_eager():
    m, plan, xs, prompt = _setup()
    ref, _ = _run(m, plan, xs, prompt, lambda k: {"demand_sized": False, "graph_replay": False})
    sched = lambda k: {"demand_sized": (k // 7) % 4 != 3, "graph_replay": (k // 5) % 3 != 0}
    out, ex = _run(m, plan, xs, prompt, sched)
    assert ex.stats.replayed_steps > 10 and ex.stats.migrations >= 2
    assert all(torch.equal(a, b) for a, b in zip(ref, out))


def test_replay_keeps_state_at_the_captured_addresses():
    m, plan, xs, prompt = _setup()
    out, ex = _run(m, plan, xs, prompt, lambda k: {"demand_sized": True, "graph_replay": True}, ahead=True)
    for entry in ex.graphs.values():
        assert entry.replays > 0
    storage = ex.arena.addresses()
    assert all(entry.addresses["kv"] == storage["kv"] for entry in ex.graphs.values())
    # moving the state under a graph is caught loudly in debug mode
    ex.arena.storage["kv"] = ex.arena.storage["kv"].clone()
    with pytest.raises(RuntimeError, match="stable addresses"):
        ex.step(m.example_inputs(plan.step(ex.k), DEV))


def test_finite_session_replays_repeated_signatures_and_runs_one_offs_eagerly():
    m, plan, xs, prompt = _setup(steps=30)
    ref, _ = _run(m, plan, xs[:30], prompt, lambda k: {"demand_sized": True, "graph_replay": False})
    out, ex = _run(m, plan, xs[:30], prompt, lambda k: {"demand_sized": True, "graph_replay": True})
    assert all(torch.equal(a, b) for a, b in zip(ref, out))
    assert ex.stats.replayed_steps > 20


def test_captures_never_race_eager_draws_in_other_threads():
    """Session 4's crash, reduced: thread A draws from the CUDA default generator (as a MiniCPM-o sampler
    and a Step-Audio2 example input did) in its concurrent seconds while thread B, also in a concurrent
    second, captures a graph that draws. Without the one gate A's draw during B's capture raised "Offset
    increment outside graph capture"; with it B's capture is upgraded to exclusive, A waits, both go on,
    and the graph's draws replay from the state it registered."""
    import threading
    from engine.core.gate import GATE
    from engine.core.graphs import GraphRuntime
    errors, stop = [], threading.Event()

    def drawer():
        s = torch.cuda.Stream()
        try:
            while not stop.is_set():
                with GATE.shared(), torch.cuda.stream(s):
                    torch.randint(0, 100, (64,), device=DEV).sum().item()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    t = threading.Thread(target=drawer)
    t.start()
    rt = GraphRuntime(DEV, "test")
    x = torch.randn(256, device=DEV)
    try:
        for _ in range(20):
            with GATE.shared():
                with rt.side():
                    y = x * torch.rand_like(x)
                graph, out = rt.capture(lambda: x * torch.rand_like(x))
                rt.replay(graph)
                torch.cuda.synchronize()
                assert out.shape == y.shape and torch.isfinite(out).all()
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors[0]
    assert GATE.upgrades >= 20 and rt.captures == 20 and rt.replays == 20
