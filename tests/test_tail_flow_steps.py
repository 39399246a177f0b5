"""The Step-Audio2 tail's flow-step count follows the backbone: MiniCPM-o 4.5's duplex loop builds its
streaming token2wav with 5 flow (Euler) steps (``init_unified`` -> ``init_token2wav(streaming=True)``,
``n_timesteps=5``), Step-Audio2's own stock with 10. The backbone declares it (``tail_options``), the session
builds the tail with it, the regions and the solver follow it, and the shared-weights key keeps the two
apart (the shared modules hold per-step constants). CPU, tiny sizes, seeded random weights.
"""
from __future__ import annotations

import dataclasses

import pytest

from engine import registry
from engine.host.weights import WeightsKey
from engine.session import DuplexSession, SessionConfig


def _steps(tail):
    """The step count every part of the tail uses: config, Euler schedule, DiT constants, cache regions."""
    m = tail.model
    regions = {r.name: r for r in m.regions(m.spec(tail.prompt.frames))}
    return {"config": m.cfg.flow.n_timesteps, "schedule": len(m.flow.dts),
            "modulations": len(m.flow.decoder.estimator.mods), "est_att": regions["est_att"].shape[0],
            "est_cnn": regions["est_cnn"].shape[0]}


def _session_steps(**kw):
    s = DuplexSession(SessionConfig(size="tiny", device="cpu", seed=4, cpu_threads=1, **kw))
    s.start()
    try:
        return _steps(s.tail)
    finally:
        s.close()


def test_minicpmo_declares_five_flow_steps_for_its_tail_and_the_others_none():
    assert registry.get_backbone("minicpm-o-4.5").tail_kwargs() == {"n_timesteps": 5}
    others = [b.name for b in registry.backbones() if b.name != "minicpm-o-4.5"]
    assert others and all(registry.get_backbone(n).tail_kwargs() == {} for n in others)


def test_a_minicpmo_session_tail_solves_in_5_steps_and_a_step_audio2_pair_in_10(one_torch_thread):
    assert set(_session_steps(backbone="minicpm-o-4.5").values()) == {5}
    assert set(_session_steps(backbone="synthetic", tail="step-audio2").values()) == {10}


def test_the_shared_weights_key_keeps_the_step_counts_apart():
    mini = SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=4).resolved()
    pair = dataclasses.replace(mini, backbone="synthetic")
    a, b = WeightsKey.tail(mini), WeightsKey.tail(pair)
    assert a.options == (("n_timesteps", 5),) and b.options == ()
    assert a != b and dataclasses.replace(a, options=()) == b    # only the step count tells them apart
    assert "n_timesteps=5" in a.label()


def test_shared_weights_keep_their_step_count_and_refuse_another():
    make = registry.get("step-audio2").make_tail
    five = make(size="tiny", seed=2, n_timesteps=5)
    shared = five.shared_weights()
    assert _steps(make(size="tiny", seed=2, shared=shared))["config"] == 5
    assert _steps(make(size="tiny", seed=2, shared=shared, n_timesteps=5))["config"] == 5
    with pytest.raises(ValueError, match="solve the flow in 5 steps, not 10"):
        make(size="tiny", seed=2, shared=shared, n_timesteps=10)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "5"])
def test_a_bad_step_count_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="positive whole number of steps"):
        registry.get("step-audio2").make_tail(size="tiny", seed=2, n_timesteps=bad)


def test_the_plan_sizes_the_estimator_caches_by_the_step_count():
    plan = registry.get("step-audio2").plan
    for asked, steps in ((5, 5), (None, 10)):
        p = plan(size="tiny", n_timesteps=asked)
        assert {p.region(n).shape[0] for n in ("est_att", "est_cnn")} == {steps}


def test_the_step_count_is_set_in_the_config_the_model_is_built_from():
    """``load_model(n_timesteps=)`` builds the model at that count (nothing is rebuilt after load): the same
    seeded weights as the default count's, the schedule and the DiT constants made for it."""
    import torch
    from engine.models.step_audio2.weights import load_model
    five, ten = load_model(None, "tiny", 2, n_timesteps=5), load_model(None, "tiny", 2)
    assert (five.cfg.flow.n_timesteps, len(five.flow.dts), len(five.flow.decoder.estimator.mods)) == (5, 5, 5)
    assert ten.cfg.flow.n_timesteps == 10 and len(ten.flow.dts) == 10
    a, b = five.state_dict(), ten.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
