"""Core declarations: the one Toggles type and its graph-replay rule, Static regions, regions under a prefix."""
import dataclasses

import pytest
import torch

from engine.core import (STILL, Clock, Executor, Fixed, Region, SessionSpec, Static, StreamingModel, make_plan,
                         prefixed)
from engine.core.toggles import Toggles


def test_toggles_are_frozen_read_like_a_dict_and_have_one_graph_rule():
    t = Toggles(demand_sized=True, graph_replay=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.graph_replay = False
    assert t == {"demand_sized": True, "graph_replay": True} and dict(t) == {"demand_sized": True, "graph_replay": True}
    assert t.merged(graph_replay=False) == Toggles(True, False) and t.merged() == t
    assert t.effective("cpu") == Toggles(True, False)                  # no CUDA here: no graph replay
    assert Toggles(False, True).effective("cuda").graph_replay is False   # graphs need demand-sized state
    assert [Toggles.from_mode(m).mode for m in ("stock", "demand", "graphs")] == ["stock", "demand", "graphs"]
    with pytest.raises(ValueError, match="unknown mode"):
        Toggles.from_mode("fast")


def test_static_regions_have_no_time_axis():
    r = Region("spk", (2, 8), STILL, Static())
    assert r.axis is None and r.retention.describe() == "static"
    with pytest.raises(ValueError, match="no time axis"):
        Region("bad", (2, None), STILL, Static())


class _Block(torch.nn.Module):
    """A reusable block: one region under its own short name."""

    def regions(self, clock):
        return [Region("hist", (1, 3, None), clock, Fixed(2))]

    def run(self, state, x):
        h = state["hist"].get()                      # [1, 3, 2]
        y = torch.cat([h, x], dim=-1).sum(-1, keepdim=True)
        h.copy_(torch.cat([h, x], dim=-1)[..., -2:])
        return y


class _TwoBlocks(StreamingModel):
    def __init__(self):
        super().__init__()
        self.a, self.b = _Block(), _Block()

    def regions(self, spec=None):
        ck = Clock("frames", (1,))
        return prefixed("a", self.a.regions(ck)) + prefixed("b", self.b.regions(ck)) + \
            [Region("cond", (3,), STILL, Static())]

    def step(self, state, inputs, plan):
        x = inputs["x"]
        return {"y": self.b.run(state.under("b"), self.a.run(state.under("a"), x))}


def test_blocks_declare_and_read_their_state_under_a_prefix():
    m = _TwoBlocks()
    plan = make_plan(m.regions(), SessionSpec(steps=3))
    assert [r.name for r in plan.regions] == ["a.hist", "b.hist", "cond"]
    ex = Executor(m, plan, "cpu")
    ex.init_state()
    assert sorted(ex.state.under("a")) == ["hist"]
    outs = [ex.step({"x": torch.full((1, 3, 1), float(k + 1))})["y"] for k in range(3)]
    # a: 0+0+1=1, 0+1+2=3, 1+2+3=6; b sums a's outputs the same way: 1, 4, 10
    assert [float(o[0, 0, 0]) for o in outs] == [1.0, 4.0, 10.0]
    assert ex.arena.states["a.hist"].get().flatten().tolist()[:2] == [2.0, 3.0]
