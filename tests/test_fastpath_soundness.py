"""The fast-path self-check is sound, on the CPU:

* the verdict cache key holds what the bits depend on: a hash of our code, the Triton version, the GPU's SM
  count and MIG slice, the CPU's instruction set (a change of any of them checks again, in-process and on disk);
* every shape a chosen path runs at is checked before it runs: Mimi's short last second at its own frame
  count, the codec's short last second with no batched call, batched LISTEN at each group size;
* trials run as production runs them (on CUDA also captured and replayed), and the labels say where a path
  runs (the fused kernel: "on (inside captured graphs only)").
GPU counterparts: tests/test_fastpath_gpu.py, tests/test_mimi_gpu.py, tests/test_host_gpu.py.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine import fastpath

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def fresh(fresh_fastpath):
    fastpath._code_hashes.clear()
    yield
    fastpath._code_hashes.clear()


class Trial:
    """A trial whose candidate equals its reference, counting its runs."""

    def __init__(self):
        self.runs = 0

    def __call__(self, on: bool):
        self.runs += 1
        return torch.randn(8, 5, generator=torch.Generator().manual_seed(1)) * 3


def _gpu(monkeypatch, name="NVIDIA H200", sms=132, uuid="GPU-5e1f"):
    """torch.cuda's device properties as on a GPU with ``sms`` SMs (the key reads nothing else of CUDA)."""
    props = SimpleNamespace(name=name, major=9, minor=0, multi_processor_count=sms, total_memory=150 << 30,
                            uuid=uuid)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda idx: props)
    return props


# -- the cache key ---------------------------------------------------------------------------------------
def test_sm_count_and_mig_slice_are_in_the_key(monkeypatch, tmp_path):
    monkeypatch.setenv(fastpath.ENV_CACHE, str(tmp_path / "v.json"))
    props = _gpu(monkeypatch)
    t = Trial()
    assert fastpath.self_check("p", "cuda:0", "cfg", t).chosen and t.runs == 2
    assert fastpath.self_check("p", "cuda:0", "cfg", t).cached and t.runs == 2
    env = fastpath.environment("cuda:0")
    assert env["sm_count"] == "132" and env["mig"] == "none"
    props.multi_processor_count = 66                      # cuBLAS promises its bits only on the same SM count
    fastpath.clear_cache()
    assert not fastpath.self_check("p", "cuda:0", "cfg", t).cached and t.runs == 4
    props.name = "NVIDIA H200 MIG 3g.71gb"
    assert fastpath.environment("cuda:0")["mig"] == "MIG 3g.71gb"
    assert not fastpath.self_check("p", "cuda:0", "cfg", t).cached and t.runs == 6
    props.name, props.uuid = "NVIDIA H200", "MIG-7a2c"
    assert fastpath.environment("cuda:0")["mig"] == "MIG"
    assert len(json.loads((tmp_path / "v.json").read_text())) == 3          # one verdict per device kind


def test_triton_version_is_in_the_key(monkeypatch):
    monkeypatch.setattr(fastpath, "_triton_version", lambda: "3.1.0")
    t = Trial()
    fastpath.self_check("p", "cpu", "cfg", t)
    assert fastpath.environment("cpu")["triton"] == "3.1.0"
    monkeypatch.setattr(fastpath, "_triton_version", lambda: "3.2.0")
    assert not fastpath.self_check("p", "cpu", "cfg", t).cached and t.runs == 4


def test_the_cpu_instruction_set_is_in_the_key(monkeypatch):
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    t = Trial()
    fastpath.self_check("p", "cpu", "cfg", t)
    assert fastpath.environment("cpu")["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")      # MKL's AVX2 kernels round otherwise
    assert not fastpath.self_check("p", "cpu", "cfg", t).cached and t.runs == 4


def test_a_code_change_retires_the_cached_verdict(monkeypatch, tmp_path):
    pkg = tmp_path / "src" / "dc_probe_kernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernel.py").write_text("def add(a, b):\n    return a + b\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv(fastpath.ENV_CACHE, str(tmp_path / "v.json"))
    t = Trial()
    first = fastpath.self_check("p", "cpu", "cfg", t, code=["dc_probe_kernels"])
    fastpath.clear_cache()
    fastpath._code_hashes.clear()
    assert fastpath.self_check("p", "cpu", "cfg", t, code=["dc_probe_kernels"]).cached    # same code: the disk
    (pkg / "kernel.py").write_text("def add(a, b):\n    return b + a\n")             # the kernel rewritten
    fastpath.clear_cache()
    fastpath._code_hashes.clear()                                                    # a new process
    again = fastpath.self_check("p", "cpu", "cfg", t, code=["dc_probe_kernels"])
    assert first.chosen and not again.cached and t.runs == 4


def test_a_trial_hashes_its_own_package_by_default():
    from engine.models.mimi import fastpaths as mimi_fp
    assert fastpath.code_of(mimi_fp.choose) == ("engine.models.mimi", "engine.core", "engine.fastpath")
    key = json.loads(fastpath.cache_key("p", "cpu", "cfg", fastpath.code_of(mimi_fp.choose)))
    assert key["code"] == fastpath.code_hash(["engine.models.mimi", "engine.core", "engine.fastpath"])
    assert key["code"] != fastpath.code_hash(["engine.models.nemotron_codec", "engine.core", "engine.fastpath"])


# -- trials as production runs them ------------------------------------------------------------------------
def test_production_modes():
    assert fastpath.production_modes("cpu") == ("eager",)
    assert fastpath.production_modes("cpu", captured_only=True) == ()
    assert fastpath.production_modes("cuda") == ("eager", "graph")
    assert fastpath.production_modes("cuda", captured_only=True) == ("graph",)


def _mimi(cfg=None, seed=4):
    from engine.models.mimi import weights as W
    from engine.models.mimi.config import TINY
    from engine.models.mimi.model import MimiDecoder
    cfg = cfg or TINY
    return MimiDecoder(cfg).load_moshi_state(W.random_state(cfg, seed=seed))


class FakeMimi:
    """Mimi's decode_trial as on a device that keeps the bits except for the orders ``bad`` at ``frames``."""

    def __init__(self, bad=lambda frames, order: False):
        self.bad, self.calls = bad, []

    def __call__(self, model, codes, frames=None, graphs=False, **order):
        self.calls.append({"frames": frames, "graphs": graphs, **order})
        audio = torch.linspace(-1, 1, 50)
        if any(order.values()) and self.bad(frames, order):
            audio = audio + 2.0 ** -20
        return {"audio": audio, "state": {"r": torch.ones(3)}}


def test_mimi_trials_run_eagerly_and_in_graphs_where_production_captures(monkeypatch):
    from engine.models.mimi import fastpaths as FP
    fake = FakeMimi()
    monkeypatch.setattr(FP, "decode_trial", fake)
    monkeypatch.setattr(fastpath, "production_modes", lambda device, captured_only=False: ("eager", "graph"))
    FP.choose(_mimi(), "cpu", check_cpu=True)
    ref = [c for c in fake.calls if not any(v for k, v in c.items() if k not in ("frames", "graphs"))]
    assert sorted(c["graphs"] for c in ref) == [False, True]                  # the reference both ways
    cands = [c for c in fake.calls if c.get("layer_major")]
    assert {c["graphs"] for c in cands} == {False, True}                      # every candidate both ways
    assert sum(c["graphs"] for c in cands) == sum(not c["graphs"] for c in cands)


def test_nemotron_trials_run_eagerly_and_in_graphs_where_production_captures(monkeypatch):
    from engine.models.nemotron_codec import fastpaths as NF
    calls = []

    def fake(model, codes, kinds, graphs=False):
        calls.append((frozenset(kinds), graphs))
        return {"audio": torch.linspace(-1, 1, 30), "state": {"r": torch.ones(2)}}
    monkeypatch.setattr(NF, "decode_trial", fake)
    monkeypatch.setattr(fastpath, "production_modes", lambda device, captured_only=False: ("eager", "graph"))
    NF.choose(_nemotron(), "cpu", check_cpu=True)
    assert (frozenset(), False) in calls and (frozenset(), True) in calls
    assert all((k, not g) in calls for k, g in calls)


# -- every shape a chosen path runs at -------------------------------------------------------------------
def test_a_short_mimi_second_is_checked_at_its_frame_count_before_it_runs(monkeypatch):
    from engine.models.mimi import fastpaths as FP
    # the whole seconds keep the bits in every order; at 7 frames only layer-major order alone does; at 3 none
    fake = FakeMimi(bad=lambda frames, order: frames is not None and (
        frames[-1] == 3 or (frames[-1] == 7 and sum(order.values()) > 1)))
    monkeypatch.setattr(FP, "decode_trial", fake)
    m = _mimi()
    verdicts = FP.choose(m, "cpu", check_cpu=True)
    whole = {k: v for k, v in m.chosen.items() if v}
    assert whole["layer_major"] and len(whole) > 2
    n_before = len(fake.calls)
    assert m.chosen_for(12) == m.chosen and m.chosen_for(13) == m.chosen and len(fake.calls) == n_before
    assert m.chosen_for(5) == m.chosen                                      # checked, kept the bits
    assert [c["frames"] for c in fake.calls[n_before:]] == [[12, 5], [12, 5]]
    assert m.chosen_for(7) == {**dict.fromkeys(m.chosen, False), "layer_major": True}
    assert m.chosen_for(3) == dict.fromkeys(m.chosen, False)                 # refused: the reference order
    n = len(fake.calls)
    assert m.chosen_for(3) == dict.fromkeys(m.chosen, False) and len(fake.calls) == n   # once per count
    lines = [v.line() for v in verdicts if "-frame second" in v.path]
    assert any(x.startswith("layer-major order + ") and "(5-frame second): on" in x for x in lines), lines
    assert any("(7-frame second): off" in x for x in lines) and any("layer-major order (7-frame second): on" in x
                                                                    for x in lines)
    assert not m.uses("layer_major", True, frames=3) and m.uses("layer_major", False, frames=7)


def test_a_short_mimi_second_decodes_as_the_reference_whatever_the_check_says(monkeypatch):
    # real trials: with a layout-independent activation the layer-major orders keep the bits on the CPU
    # (test_mimi_fastpaths); a 5-frame last second is checked at 5 frames, then decodes the reference bits
    from engine.models.mimi import fastpaths as FP
    from engine.models.mimi.config import with_context
    from engine.models.mimi.config import TINY
    monkeypatch.setattr(torch.nn.functional, "elu", lambda x, *a, **k: torch.relu(x))
    m = _mimi(with_context(TINY, 40), seed=3)
    verdicts = FP.choose(m, "cpu", check_cpu=True)
    assert m.chosen["layer_major"], [v.line() for v in verdicts]
    codes = torch.randint(0, TINY.bins, (8, 17), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        got = FP.decode_trial(m, codes, frames=[12, 5])["audio"]                 # the chosen order, as flush runs it
        ref = FP.decode_trial(m, codes, frames=[12, 5], **FP.REFERENCE)["audio"]
    assert 5 in m.chosen_at and any("(5-frame second)" in v.path for v in verdicts)
    assert torch.equal(got, ref) and ref.abs().max() > 1e-3


def _nemotron(seed=3):
    from engine.models.nemotron_codec import weights as W
    from engine.models.nemotron_codec.config import TINY
    from engine.models.nemotron_codec.model import NemotronCodecDecoder
    m = NemotronCodecDecoder(TINY)
    W.load_into(m, W.check_state(W.random_state(TINY, seed), TINY, "test"))
    return m


def test_a_short_codec_second_makes_no_batched_call(monkeypatch):
    # the codec's verdicts hold at 12 and 13 frames; a short last second (flush, synth) makes every call per
    # frame, so no batched call runs at a shape no check has seen
    from engine.models.nemotron_codec import blocks
    from engine.models.nemotron_codec.config import TINY
    from engine.models.nemotron_codec.tail import make_tail
    real, seen = blocks.per_frame, []

    def spy(fn, x, batched=False, *args, **kwargs):
        seen.append((x.shape[0], bool(batched)))
        return real(fn, x, batched, *args, **kwargs)
    monkeypatch.setattr(blocks, "per_frame", spy)
    m = _nemotron()
    m.batched = True                                   # every kind batched where it may be (given explicitly)
    tail = make_tail(cfg=TINY, device="cpu", shared={"model": m})
    tail.start()
    codes = torch.randint(0, TINY.codebook_size, (TINY.num_quantizers, 30), generator=torch.Generator().manual_seed(2))
    out = np.concatenate([tail.push(codes), tail.flush()])
    assert out.size and {n for n, b in seen if b} == {12, 13}                 # whole seconds batched
    assert seen and all(not b for n, b in seen if n == 5)                    # the 5-frame second: per frame
    assert any(n == 5 for n, _ in seen)


# -- labels ------------------------------------------------------------------------------------------------
def test_a_path_taken_only_in_captures_says_so(monkeypatch):
    from engine.models.step_audio2 import dit, fused, hift
    from engine.models.step_audio2.checked import CheckedPaths
    runs = []

    def trial(shape, path, on, inputs):
        runs.append((path, on))
        return [inputs[0] * 2]
    cp = CheckedPaths("toy", ("plain", "fused elementwise"), trial, lambda s, p: [torch.arange(1.0, s + 1.0)],
                      captured_only=dit.captured_only)
    assert cp.which(4, torch.device("cpu"), "cfg") == {"plain": True, "fused elementwise": False}
    plain, fz = cp.verdicts()
    assert plain.line().startswith("toy plain (4 frames): on — bit-identical")
    assert fz.line() == "toy fused elementwise (4 frames): off — not applicable: it runs only inside captured " \
                        "CUDA graphs" and all(p == "plain" for p, _ in runs)
    # where it can run (on CUDA: captured only), a chosen verdict says where it runs
    monkeypatch.setattr(fastpath, "production_modes", lambda device, captured_only=False: ("eager",))
    cp.clear()
    fastpath.clear_cache()
    cp.which(4, torch.device("cpu"), "cfg")
    assert cp.verdicts()[1].line().startswith("toy fused elementwise (4 frames): on (inside captured graphs only) —")
    assert cp.verdicts()[0].line().startswith("toy plain (4 frames): on —")
    assert dit.captured_only("fused elementwise") and hift.captured_only("fused elementwise")
    monkeypatch.setattr(fused, "EAGER", True)                                # then it runs in eager steps too
    assert not dit.captured_only("fused elementwise") and not dit.captured_only("parallel lanes")

