"""Step-Audio2 tail plumbing on the CPU (tiny size): regions and plans, checkpoint folder loading, prompts,
the live tail == offline synthesis, and the synth command."""

import numpy as np
import pytest
import torch

from engine.cli import synth as synth_cli
from engine.core import DemandArena, SessionSpec, StockArena, make_plan
from engine.models import registry
from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.config import flow_config_from_yaml, preset
from engine.models.step_audio2.prompt import load_npz, synthetic_prompt
from engine.models.step_audio2.stream import schedule, synthesize
from engine.models.step_audio2.tail import StepAudio2Tail

TINY = preset("tiny")


@pytest.fixture(scope="module")
def tiny_state():
    return W.random_state_dict(TINY, seed=2)


@pytest.fixture(scope="module")
def tiny_model(tiny_state):
    return W.build(TINY, tiny_state, "cpu")


def test_plan_has_first_second_and_steady_shapes_with_prompt_plus_100():
    plan = registry.get("step-audio2").plan(size="released")
    seq = [(s.before["est_att"], s.grown["est_att"], s.after["est_att"]) for s in plan.timeline]
    assert seq == [(300, 350, 350), (350, 400, 400), (400, 450, 400)]
    assert plan.settled_at == 2 and len(plan.signatures) == 3
    assert plan.demand["est_att"] == 450 and plan.demand["enc.att"] == 450
    db, sb = plan.demand_bytes(), plan.stock_bytes()
    assert db["est_att"] == 10 * 16 * 2 * 8 * 450 * 128 * 4
    assert sum(db.values()) < 0.5 * sum(sb.values())


@pytest.mark.parametrize("n,expect", [(1, [(0, 1, True)]), (28, [(0, 28, True)]), (29, [(0, 28, False), (25, 4, True)]),
                                      (53, [(0, 28, False), (25, 28, True)])])
def test_schedule_follows_the_stock_feeding_rule(n, expect):
    assert schedule(n) == expect


def test_newest_first_region_demand_arena_matches_stock_arena(tiny_model):
    spec = tiny_model.spec(6, steps=5, last_tokens=3)
    regions = [r for r in tiny_model.regions(spec) if r.name == "est_att"]
    spec = SessionSpec(steps=5, prefix={"est_att": 6}, last_advance={"mel": 6})
    plan = make_plan(regions, spec)
    g = torch.Generator().manual_seed(0)
    arenas = [DemandArena(plan, "cpu"), StockArena(plan, "cpu")]
    init = torch.randn(arenas[0]["est_att"].get().shape, generator=g)
    for a in arenas:
        a["est_att"].get().copy_(init)
    for k in range(5):
        sp = plan.step(k)
        adv = sp.grown["est_att"] - sp.before["est_att"]
        new = torch.randn(plan.region("est_att").shape_at(adv), generator=g)
        views = []
        for a in arenas:
            a.begin(sp)
            a["est_att"].tail().copy_(new)
            views.append(a["est_att"].grow().clone())
            a.commit(sp)
        assert torch.equal(views[0], views[1])
        assert torch.equal(views[0].narrow(4, 0, new.shape[4]), new)        # the newest units lead
        assert torch.equal(arenas[0]["est_att"].get(), arenas[1]["est_att"].get())


def _write_checkpoint(folder, state, old_style_hift=False):
    flow = {k[5:]: v for k, v in state.items() if k.startswith("flow.")}
    hift = {"generator." + k[5:]: v for k, v in state.items() if k.startswith("hift.")}
    if old_style_hift:
        hift = {k.replace("parametrizations.weight.original0", "weight_g")
                 .replace("parametrizations.weight.original1", "weight_v"): v for k, v in hift.items()}
    torch.save(flow, folder / "flow.pt")
    torch.save(hift, folder / "hift.pt")
    e, d = TINY.flow.encoder, TINY.flow.dit
    from minicpmo45_stock_folder import FLOW_YAML          # the released flow.yaml, at tiny dims
    (folder / "flow.yaml").write_text(FLOW_YAML.format(e=e, d=d))


@pytest.mark.parametrize("old_style", [False, True])
def test_checkpoint_folder_loads_the_same_weights(tmp_path, tiny_state, old_style):
    _write_checkpoint(tmp_path, tiny_state, old_style)
    cfg, state = W.checkpoint_state(tmp_path)
    assert cfg.flow.encoder == TINY.flow.encoder and cfg.flow.dit == TINY.flow.dit and cfg.hift == TINY.hift
    assert set(state) == set(tiny_state)
    assert all(torch.equal(state[k], tiny_state[k]) for k in state)


def test_checkpoint_errors_name_the_file(tmp_path, tiny_state):
    _write_checkpoint(tmp_path, tiny_state)
    (tmp_path / "hift.pt").unlink()
    with pytest.raises(FileNotFoundError, match="hift.pt"):
        W.checkpoint_state(tmp_path)
    _write_checkpoint(tmp_path, tiny_state)
    flow = torch.load(tmp_path / "flow.pt")
    flow["encoder_proj.weight"] = torch.zeros(3, 3)
    torch.save(flow, tmp_path / "flow.pt")
    with pytest.raises(ValueError, match="flow.pt"):
        W.checkpoint_state(tmp_path)


class _Pwn:
    """What a malicious checkpoint pickles: a call of os.system when it is unpickled."""

    def __reduce__(self):
        import os
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("form", ["torch.save", "torch.save legacy", "bare pickle"])
def test_a_pickle_that_would_run_code_is_refused_in_one_line_when_the_folder_is_chosen(tmp_path, tiny_state, form):
    """The folder check reads the pickle's opcodes (nothing runs) and refuses it before Start, in one line that
    names the call and never repeats torch's advice to load with weights_only off; the load refuses it too."""
    import pickle
    from engine.models.step_audio2 import resolve_checkpoint
    _write_checkpoint(tmp_path, tiny_state)
    resolve_checkpoint(str(tmp_path))                              # the sound folder passes
    state = {"w": torch.zeros(2), "x": _Pwn()}
    if form == "bare pickle":
        (tmp_path / "flow.pt").write_bytes(pickle.dumps(_Pwn(), protocol=4))
    else:
        torch.save(state, tmp_path / "flow.pt", _use_new_zipfile_serialization=form == "torch.save")
    for check in (lambda: resolve_checkpoint(str(tmp_path)), lambda: W._load_pt(tmp_path / "flow.pt")):
        with pytest.raises(ValueError) as e:
            check()
        msg = str(e.value)
        assert "\n" not in msg and "holds pickled code" in msg and "weights_only" not in msg, msg
    assert "posix.system" in msg or "os.system" in msg or form == "bare pickle"


def test_flow_yaml_never_builds_objects(tmp_path):
    (tmp_path / "flow.yaml").write_text("flow: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ValueError, match="flow.yaml"):
        flow_config_from_yaml(tmp_path / "flow.yaml")


def test_npz_prompt_is_fitted_to_two_frames_a_token_and_validated(tmp_path):
    g = np.random.RandomState(0)
    np.savez(tmp_path / "p.npz", prompt_tokens=g.randint(0, 6561, 31), prompt_mel=g.randn(59, 80).astype(np.float32),
             speaker_embedding=g.randn(192).astype(np.float32))
    p = load_npz(tmp_path / "p.npz")
    assert p.tokens.shape == (1, 31) and p.mel.shape == (1, 62, 80) and p.spk.shape == (1, 192)
    assert torch.equal(p.mel[0, 58], p.mel[0, 61])              # replicate-padded like the stock
    np.savez(tmp_path / "bad.npz", prompt_tokens=g.randint(0, 6561, 5), prompt_mel=g.randn(10, 80))
    with pytest.raises(ValueError, match="speaker_embedding"):
        load_npz(tmp_path / "bad.npz")


def test_live_tail_equals_offline_synthesis(tiny_model):
    prompt = synthetic_prompt(1.32, seed=4)
    tokens = torch.randint(0, 6561, (87,), generator=torch.Generator().manual_seed(9)).tolist()
    offline = np.concatenate(synthesize(tiny_model, prompt, tokens, "demand", seed=5))
    tail = StepAudio2Tail(tiny_model, prompt, "tiny", synthetic=True, mode="demand")
    tail.start(seed=5)
    first = tail.push(torch.tensor(tokens[:25]).view(1, -1))
    assert first.size == 0                                     # the lookahead is not there yet
    out = [first] + [tail.push(torch.tensor(tokens[i:i + 25]).view(1, -1)) for i in range(25, 87, 25)]
    out.append(tail.flush())
    assert np.array_equal(np.concatenate(out), offline)


def test_synth_command_writes_the_waveform(tmp_path, tiny_model):
    tokens = np.random.RandomState(1).randint(0, 6561, 33)
    np.save(tmp_path / "t.npy", tokens)
    rc = synth_cli.main(["--model", "step-audio2", "--size", "tiny", "--tokens", str(tmp_path / "t.npy"),
                         "--out", str(tmp_path / "o.npy"), "--seed", "2", "--mode", "stock"])
    assert rc == 0
    wav = np.load(tmp_path / "o.npy")
    ref = synthesize(tiny_model, synthetic_prompt(6.0, 2), tokens.tolist(), "demand", seed=2)
    assert wav.dtype == np.float32 and np.array_equal(wav, np.concatenate(ref))


def test_synth_command_reports_a_bad_tokens_file(tmp_path, capsys):
    np.save(tmp_path / "t.npy", np.zeros((2, 3), dtype=np.int64))
    rc = synth_cli.main(["--model", "step-audio2", "--size", "tiny", "--tokens", str(tmp_path / "t.npy"),
                         "--out", str(tmp_path / "o.npy")])
    assert rc == 1 and "1-D" in capsys.readouterr().err
