"""Planner math: exact per-step shapes, retention, signatures and demand sizes (CPU, pure logic)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from engine.core import (Clock, Fixed, Horizon, PrefixWindow, Region, Ring, SessionSpec, SlidingWindow,
                         format_plan, make_plan)


def _prefix_region(window, pattern, name="kv"):
    return Region(name, (2, None, 4), Clock("c", tuple(pattern)), PrefixWindow(window), stock_units=1000)


@given(window=st.integers(1, 200), prefix=st.integers(0, 400), adv=st.integers(1, 120),
       steps=st.integers(1, 60))
@settings(max_examples=200, deadline=None)
def test_prefix_window_lengths_never_exceed_demand_and_keep_prefix(window, prefix, adv, steps):
    r = _prefix_region(window, (adv,))
    plan = make_plan([r], SessionSpec(steps=steps, prefix={"kv": prefix}))
    produced = 0
    for s in plan.timeline:
        assert s.before["kv"] == prefix + min(window, produced)
        assert s.grown["kv"] == s.before["kv"] + adv
        produced += adv
        assert s.after["kv"] == prefix + min(window, produced)
        for n in ("before", "grown", "after"):
            assert getattr(s, n)["kv"] <= plan.demand["kv"]
    assert plan.demand["kv"] == prefix + min(window, adv * (steps - 1)) + adv


@given(window=st.integers(1, 200), prefix=st.integers(0, 50), adv=st.integers(1, 120))
@settings(max_examples=200, deadline=None)
def test_open_ended_signature_count_is_what_the_policy_implies(window, prefix, adv):
    r = _prefix_region(window, (adv,))
    plan = make_plan([r], SessionSpec(prefix={"kv": prefix}))
    # before-lengths prefix + min(window, k*adv) for k = 0 .. ceil(window/adv): that many distinct shapes
    assert len(plan.signatures) == math.ceil(window / adv) + 1
    # the steady state repeats forever: step(k) far away has the steady signature
    assert plan.step(10_000).signature == plan.timeline[-1].signature


def test_ring_and_fixed_regions_have_one_shape_per_clock_phase():
    clk = Clock("frames", (12, 13))
    regs = [Region("ring", (2, 8, None, 64), clk, Ring(250)),
            Region("conv", (1, 512, None), clk, Fixed(6))]
    plan = make_plan(regs, SessionSpec())
    assert len(plan.signatures) == 2                      # 12-frame and 13-frame seconds
    assert plan.demand == {"ring": 250, "conv": 6}
    assert [plan.step(k).advances["frames"] for k in range(5)] == [12, 13, 12, 13, 12]


def test_sliding_window_and_last_step_override():
    clk = Clock("tok", (25,))
    r = Region("w", (None,), clk, SlidingWindow(60))
    plan = make_plan([r], SessionSpec(steps=5, last_advance={"tok": 7}))
    assert [s.before["w"] for s in plan.timeline] == [0, 25, 50, 60, 60]
    assert plan.timeline[-1].advances["tok"] == 7 and plan.timeline[-1].is_last
    assert plan.timeline[-1].grown["w"] == 67
    assert plan.demand["w"] == 85


def test_horizon_demand_is_session_length_and_open_ended_horizon_is_refused():
    r = Region("noise", (1, 80, None), Clock("mel", (50,)), Horizon(30000), stock_units=30000)
    plan = make_plan([r], SessionSpec(steps=40))
    assert plan.demand["noise"] == 2000
    assert plan.demand_bytes()["noise"] * 15 == plan.stock_bytes()["noise"]
    with pytest.raises(ValueError, match="horizon"):
        make_plan([r], SessionSpec())


def test_bad_declarations_are_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="time axis"):
        Region("x", (1, 2), Clock("c", (1,)), PrefixWindow(3))
    with pytest.raises(ValueError, match="at most one"):
        Region("x", (None, None), Clock("c", (1,)), Fixed(3))
    with pytest.raises(ValueError, match="pattern"):
        Clock("c", ())
    r = Region("x", (None,), Clock("c", (1,)), Fixed(3))
    with pytest.raises(ValueError, match="duplicate"):
        make_plan([r, r], SessionSpec())
    with pytest.raises(ValueError, match="unknown regions"):
        make_plan([r], SessionSpec(prefix={"nope": 3}))


def test_format_plan_prints_timeline_signatures_and_bytes():
    r = _prefix_region(100, (50,))
    text = format_plan(make_plan([r], SessionSpec(prefix={"kv": 300}, label="t")))
    assert "prefix + window 100" in text and "shape signatures: 3" in text
    assert "300->350->350  kv" in text and "% less than stock-sized" in text
    assert max(len(line) for line in text.splitlines()) <= 120


def test_bench_plan_cli_lists_every_registered_model(capsys):
    from engine.bench.cli import main
    assert main(["plan", "--model", "toy", "--rows", "3"]) == 0
    out = capsys.readouterr().out
    assert "Toy streamer" in out and "shape signatures" in out
    assert main(["plan"]) == 0
    with pytest.raises(SystemExit):
        main(["plan", "--model", "no-such-model"])


def test_stock_shape_overrides_the_stock_bytes_beyond_the_time_axis():
    from engine.core import StockArena
    r = Region("est", (10, 2, None, 4), Clock("mel", (50,)), PrefixWindow(100), stock_shape=(16, 2, 1000, 4))
    plan = make_plan([r], SessionSpec(prefix={"est": 300}))
    assert plan.stock_bytes()["est"] == 16 * 2 * 1000 * 4 * 4
    assert plan.demand_bytes()["est"] == 10 * 2 * 450 * 4 * 4
    arena = StockArena(plan, "cpu")
    assert tuple(arena.static["est"].shape) == (16, 2, 1000, 4)
    assert arena["est"].get().shape == (10, 2, 300, 4)
