"""Arena address stability, in-place retention, and executor toggles giving identical bits (CPU)."""
import pytest
import torch

from engine.core import (Clock, DemandArena, Executor, PrefixWindow, Region, SessionSpec, StockArena,
                         make_plan)
from engine.models.toy import ToyStreamer
from engine.core.toggles import Toggles


def _run(model, plan, inputs, prompt, toggles_per_step, device="cpu", seed=1234, debug=False):
    torch.manual_seed(seed)
    ex = Executor(model, plan, device, **toggles_per_step(0), debug=debug)
    ex.init_state({"kv": prompt})
    outs = []
    for k, x in enumerate(inputs):
        ex.set_toggles(Toggles(**toggles_per_step(k)))
        outs.append(ex.step({"x": x})["y"])
    return outs, ex


def _inputs(model, plan, n, device="cpu", seed=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, model.c, plan.step(k).advances["frames"], generator=g).to(device) for k in range(n)]


def _prompt(model, device="cpu"):
    g = torch.Generator().manual_seed(3)
    return torch.randn(2, 1, model.h, model.prompt_frames, model.d, generator=g).to(device)


def test_demand_arena_addresses_are_stable_for_a_long_session():
    m = ToyStreamer()
    plan = make_plan(m.regions(m.spec()), m.spec())
    ex = Executor(m, plan, "cpu", demand_sized=True)
    ex.init_state({"kv": _prompt(m)})
    first = ex.arena.addresses()
    ptrs = set()
    with torch.no_grad():
        for x in _inputs(m, plan, 300):
            ex.step({"x": x})
            assert ex.arena.addresses() == first
            ptrs.add(ex.arena["kv"].get().data_ptr())
    assert ptrs == {first["kv"]}
    assert ex.state_bytes() == sum(plan.demand_bytes().values())


@pytest.mark.parametrize("newest_first", [False, True])
@pytest.mark.parametrize("window,adv", [(5, 3), (100, 50), (7, 7), (4, 9)])
def test_in_place_retention_matches_cat_truncation(newest_first, window, adv):
    clk = Clock("c", (adv,))
    r = Region("kv", (None, 2), clk, PrefixWindow(window), newest_first=newest_first)
    spec = SessionSpec(steps=12, prefix={"kv": 4})
    plan = make_plan([r], spec)
    arenas = [DemandArena(plan, "cpu"), StockArena(plan, "cpu")]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randn(4, 2, generator=g)
    for a in arenas:
        a["kv"].set(prompt)
    views_ref = prompt.clone()
    for s in plan.timeline:
        new = torch.randn(adv, 2, generator=g)
        views = []
        for a in arenas:
            a.begin(s)
            a["kv"].tail().copy_(new)
            views.append(a["kv"].grow().clone())
            a.commit(s)
        assert torch.equal(views[0], views[1])
        assert torch.equal(arenas[0]["kv"].get(), arenas[1]["kv"].get())
        if not newest_first:
            assert torch.equal(arenas[0]["kv"].get()[:4], prompt)
        # reference semantics without any arena: cat then keep [prefix] + last window
        ref = torch.cat([new, views_ref]) if newest_first else torch.cat([views_ref, new])
        views_ref = torch.cat([ref[:4], ref[ref.shape[0] - min(window, ref.shape[0] - 4):]])
        assert torch.equal(views_ref, arenas[0]["kv"].get())


@pytest.mark.parametrize("schedule", ["stock", "demand", "flip-every-step", "flip-graph-request"])
def test_executor_modes_and_toggle_flips_give_identical_bits(schedule):
    m = ToyStreamer()
    plan = make_plan(m.regions(m.spec()), m.spec())
    xs = _inputs(m, plan, 40)
    ref, _ = _run(m, plan, xs, _prompt(m), lambda k: {"demand_sized": True, "graph_replay": False})
    sched = {
        "stock": lambda k: {"demand_sized": False, "graph_replay": False},
        "demand": lambda k: {"demand_sized": True, "graph_replay": False},
        "flip-every-step": lambda k: {"demand_sized": k % 2 == 0, "graph_replay": False},
        # graph replay requested on the CPU: runs eagerly, says so once
        "flip-graph-request": lambda k: {"demand_sized": k % 3 != 0, "graph_replay": k % 2 == 0},
    }[schedule]
    with torch.no_grad():
        out, ex = _run(m, plan, xs, _prompt(m), sched)
    assert all(torch.equal(a, b) for a, b in zip(ref, out))
    assert len({o.abs().sum().item() for o in out}) > 1           # real, varying outputs
    if schedule == "flip-every-step":
        assert ex.stats.migrations == 39
    if schedule == "flip-graph-request":
        assert ex.toggles()["graph_replay"] is False
        assert any("needs CUDA" in n for n in ex.stats.notes)


def test_stock_arena_holds_the_stock_constants_and_demand_is_smaller():
    m = ToyStreamer()
    plan = make_plan(m.regions(m.spec()), m.spec())
    stock = Executor(m, plan, "cpu", demand_sized=False)
    demand = Executor(m, plan, "cpu", demand_sized=True)
    assert stock.state_bytes() > demand.state_bytes()
    assert demand.state_bytes() == sum(plan.demand_bytes().values())


def test_executor_refuses_a_prefill_after_the_first_step():
    m = ToyStreamer()
    plan = make_plan(m.regions(m.spec()), m.spec())
    ex = Executor(m, plan, "cpu")
    with torch.no_grad():
        ex.step({"x": _inputs(m, plan, 1)[0]})
    with pytest.raises(RuntimeError, match="before the first step"):
        ex.init_state({})


def test_finite_plan_refuses_steps_past_its_end():
    m = ToyStreamer()
    plan = make_plan(m.regions(m.spec(steps=2)), m.spec(steps=2))
    ex = Executor(m, plan, "cpu")
    with torch.no_grad():
        for x in _inputs(m, plan, 2):
            ex.step({"x": x})
        with pytest.raises(IndexError, match="past the session"):
            ex.step({"x": x})
