"""Toggles are one value from the UI to the executor: every layer's ``set_toggles`` takes a ``Toggles``, a
request is parked once (PendingToggles) and the CUDA rule lives in engine/core/toggles.py only."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from engine.backbones.base import Backbone
from engine.backbones.minicpmo45 import MiniCPMO45Backbone
from engine.backbones.synthetic import SyntheticBackbone
from engine.core.executor import Executor
from engine.core.toggles import PendingToggles, Toggles
from engine.host.runner import HostedRunner
from engine.host.session import HostedSession
from engine.serve.client import RemoteRunner
from engine.session import DuplexSession, LiveRunner, SessionConfig
from engine.tail import DecoderTail, EngineTail

LAYERS = (Executor, DecoderTail, EngineTail, Backbone, SyntheticBackbone, MiniCPMO45Backbone, DuplexSession,
          HostedSession, HostedRunner, LiveRunner, RemoteRunner)


@pytest.mark.parametrize("cls", LAYERS, ids=lambda c: c.__name__)
def test_every_layer_takes_one_toggles_value(cls):
    params = list(inspect.signature(cls.set_toggles).parameters.values())[1:]
    assert [(p.name, p.annotation) for p in params] == [("toggles", "Toggles")]


def test_a_parked_request_is_taken_once_and_stays_asked():
    p = PendingToggles(Toggles(True, True))
    assert p.take() is None and p.asked == Toggles(True, True)
    p.ask(Toggles(False, True))
    p.ask(Toggles(False, False))                        # the last request wins
    assert p.take() == Toggles(False, False) and p.take() is None
    assert p.asked == Toggles(False, False)
    with pytest.raises(TypeError, match="Toggles value"):
        p.ask({"demand_sized": False})


def test_the_cuda_rule_is_the_values_own():
    t = Toggles(demand_sized=False, graph_replay=True)
    assert t.on("cpu") == Toggles(False, False)         # graphs asked of the models only where they run
    assert t.effective("cpu") == Toggles(False, False)
    assert Toggles(True, True).merged(graph_replay=False) == Toggles(True, False)


def test_a_session_applies_a_request_at_the_next_second(one_torch_thread):
    s = DuplexSession(SessionConfig(tail="mimi", size="tiny", device="cpu", seed=2, cpu_threads=1))
    s.start()
    frame = np.random.default_rng(0).uniform(-0.1, 0.1, 24000).astype(np.float32)
    assert s.process(frame)[1].demand_sized
    s.set_toggles(Toggles(demand_sized=False, graph_replay=True))
    assert s.asked_toggles() == Toggles(False, True)    # as asked, CUDA or not
    rec = s.process(frame)[1]
    assert not rec.demand_sized and not rec.graph_replay
    assert s.toggles() == Toggles(False, False) and s.tail.executor.arena.kind == "stock"
    assert s.backbone.executor.arena.kind == "stock"
    s.close()
