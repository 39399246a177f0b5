"""The host's LLM rounds (``EngineHost(llm_rounds=True)``, engine/host/llm_rounds.py). On the CPU a session never
joins (every CPU second runs exclusively and replays no graphs) and says why, and hosting stays identical to solo;
the membership rules are checked against a stand-in backbone; the rounds themselves are
tests/test_minicpmo45_rounds.py's, and whole hosted sessions in rounds are the GPU's test."""
import types

import numpy as np
import pytest
import torch

from engine.host import EngineHost
from engine.host.llm_rounds import LLMRoundsHost
from tests.test_host import _cfg, _hosted, _inputs, _solo


def test_on_the_cpu_sessions_say_why_they_step_alone_and_equal_solo(one_torch_thread):
    host = EngineHost(device="cpu", launch="threads", llm_rounds=True)
    cfgs = [_cfg("step-audio2", backbone="minicpm-o-4.5"), _cfg("step-audio2", backbone="minicpm-o-4.5")]
    inputs = _inputs(2, 4)
    outs, runners = _hosted(host, cfgs, inputs, [None, {2: {"demand_sized": False}}])
    try:
        for i, (c, frames) in enumerate(zip(cfgs, inputs)):
            assert np.array_equal(outs[i], _solo(c, frames, [None, {2: {"demand_sized": False}}][i]))
        for r in runners:                 # the second flipped its policy: it left and asked again, same answer
            assert r.hosted.rounds_note.startswith("LLM rounds need CUDA graph replay")
            assert r.hosted.llm_rounds is None
        assert host.llm_rounds.report() == []
    finally:
        host.close()


class _Rounds:
    """A stand-in for LLMRounds: records joins and leaves."""

    def __init__(self, llm):
        self.llm, self.members, self.log = llm, [], []

    def join(self, key, store, solo, allow):
        self.members.append(key)
        self.log.append(("join", key, allow()))
        return f"joined {key}"

    def leave(self, key):
        self.members.remove(key)
        self.log.append(("leave", key))

    def report(self):
        return {"members": len(self.members)}


def test_membership_groups_by_llm_up_to_the_slots_and_leaves(monkeypatch):
    from engine.backbones.minicpmo45 import backbone as bbmod
    host = types.SimpleNamespace(device=torch.device("cuda"), launch="threads")
    rh = LLMRoundsHost(host, slots=2)
    monkeypatch.setattr(rh, "_group", lambda bb: _Rounds(bb.llm))
    llm_a, llm_b = object(), object()

    def hosted(i, llm, toggles=(True, True)):
        bb = bbmod.MiniCPMO45Backbone.__new__(bbmod.MiniCPMO45Backbone)
        bb.llm, bb.kv_llm, bb.rounds, bb.round_key = llm, types.SimpleNamespace(sink=9), None, None
        bb.own_forward = lambda e: None
        bb.ensure_llm_sink = lambda: True
        bb.toggles = lambda: {"graph_replay": toggles[0], "demand_sized": toggles[1]}
        return types.SimpleNamespace(id=i, session=types.SimpleNamespace(backbone=bb), in_shared_second=True)
    hs = [hosted(0, llm_a), hosted(1, llm_a), hosted(2, llm_a), hosted(3, llm_b), hosted(4, llm_a, (False, True))]
    notes = [rh.join(h) for h in hs]
    assert notes[:4] == ["joined 0", "joined 1", "joined 2", "joined 3"]
    assert notes[4] == "the session does not replay graphs over demand stores: it steps alone"
    assert [g.members for g in rh.groups] == [[0, 1], [2], [3]]          # 2 slots a group, one LLM a group
    assert hs[1].session.backbone.rounds is rh.groups[0] and hs[1].session.backbone.round_key == 1
    rh.leave(hs[2])
    assert [g.members for g in rh.groups] == [[0, 1], [3]] and hs[2].session.backbone.rounds is None
    rh.leave(hs[4])                                                    # never joined: nothing to do
    assert rh.report() == [{"members": 2}, {"members": 1}]
    other = types.SimpleNamespace(id=7, session=types.SimpleNamespace(backbone=object()), in_shared_second=True)
    assert rh.join(other).startswith("the object has no LLM rounds")


def test_the_checks_are_made_before_the_join_beside_the_other_seconds(monkeypatch):
    """``prepare`` (run under the shared gate before the exclusive join) makes the LLM's row verdicts and the
    device's check at the size the session's group will have; the join then finds them made and checks nothing."""
    from engine.backbones.minicpmo45 import backbone as bbmod
    from engine.backbones.minicpmo45 import group_graphs
    host = types.SimpleNamespace(device=torch.device("cuda"), launch="threads")
    rh = LLMRoundsHost(host, slots=4)
    made = []
    monkeypatch.setattr(group_graphs, "check_rows", lambda llm, counts: made.append(("rows", tuple(counts))) or {})
    monkeypatch.setattr(group_graphs, "check", lambda llm, fresh, dev, n, v, graphs, seed, absent: made.append(
        ("check", n)) or (True, f"{n} checked"))
    llm = object()

    def hosted(i):
        bb = bbmod.MiniCPMO45Backbone.__new__(bbmod.MiniCPMO45Backbone)
        bb.llm, bb.kv_llm, bb.rounds, bb.round_key = llm, types.SimpleNamespace(sink=9), None, None
        bb.own_forward, bb.ensure_llm_sink = (lambda e: None), (lambda: True)
        bb.toggles = lambda: {"graph_replay": True, "demand_sized": True}
        bb.dims, bb.llm_regions, bb.device = types.SimpleNamespace(llm=types.SimpleNamespace(layers=1)), [None], \
            torch.device("cuda")
        return types.SimpleNamespace(id=i, session=types.SimpleNamespace(backbone=bb), in_shared_second=True)
    a, b = hosted(0), hosted(1)
    rh.prepare(a)                                   # the first member: the verdicts, no group step to check yet
    assert made == [("rows", (1, 2, 3, 4))]
    assert rh.join(a) == "one member steps its own graphs"
    rh.prepare(b)                                   # the second: the check at 2, before its join
    assert made[1:] == [("check", 2)]
    assert rh.join(b) == "2 checked" and made == [("rows", (1, 2, 3, 4)), ("check", 2)]    # nothing more
