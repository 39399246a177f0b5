"""engine.fastpath: a faster path runs only where the start-up self-check finds it bit-identical."""
import json

import pytest
import torch

from engine import fastpath
from engine.fastpath import Verdict


@pytest.fixture(autouse=True)
def fresh(fresh_fastpath):
    yield


def _x(seed=0, n=64):
    return torch.randn(n, 33, generator=torch.Generator().manual_seed(seed))


class Counting:
    """A trial whose candidate is the reference's sum in another order (or one ulp off), counting calls."""

    def __init__(self, ulp: bool = False, raises: bool = False):
        self.calls, self.ulp, self.raises = [], ulp, raises
        self.x, self.w = _x(1), _x(2, 33)

    def __call__(self, on: bool):
        self.calls.append(on)
        ref = self.x @ self.w                                     # [64, 33]
        if not on:
            return {"y": ref, "state": [self.x.sum(0)]}
        if self.raises:
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED\nsecond line")
        y = ref.clone()
        if self.ulp:
            y[3, 5] = torch.nextafter(y[3, 5], torch.tensor(float("inf")))   # one ulp up, one element
        return {"y": y, "state": [self.x.sum(0)]}


def test_matching_path_is_chosen_and_cached():
    t = Counting()
    v = fastpath.self_check("batched convs", "cpu", ("cfg", 1), t)
    assert v.chosen and not v.cached and v.max_abs_diff == 0.0
    assert "bit-identical" in v.reason and "2 tensors" in v.reason
    assert t.calls == [False, True]
    again = fastpath.self_check("batched convs", "cpu", ("cfg", 1), t)
    assert again.chosen and again.cached and t.calls == [False, True]      # not run again
    assert again.line().startswith("batched convs: on") and "cached" in again.line()
    other = fastpath.self_check("batched convs", "cpu", ("cfg", 2), t)      # another config: checked again
    assert other.chosen and not other.cached and len(t.calls) == 4


def test_one_ulp_off_is_refused_with_the_difference():
    t = Counting(ulp=True)
    v = fastpath.self_check("batched matmuls", "cpu", "cfg", t)
    assert not v.chosen
    want = float(torch.nextafter(t.x[3] @ t.w[:, 5], torch.tensor(float("inf"))) - t.x[3] @ t.w[:, 5])
    assert v.max_abs_diff == pytest.approx(want) and 0 < v.max_abs_diff < 1e-5
    assert "max abs diff" in v.reason and "out.y" in v.reason
    assert t.calls == [False, True, False]          # the reference was run again: it repeats its bits
    assert v.line().startswith("batched matmuls: off")


def test_reference_that_does_not_repeat_itself_is_named():
    n = [0]

    def trial(on):
        n[0] += 1
        return _x() + n[0] * 1e-3
    v = fastpath.self_check("p", "cpu", "cfg", trial)
    assert not v.chosen and "does not repeat its own bits" in v.reason


def test_a_raising_candidate_is_refused_and_not_fatal():
    v = fastpath.self_check("p", "cpu", "cfg", Counting(raises=True))
    assert not v.chosen and v.reason == "the check failed: RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED"


def test_zero_outputs_prove_nothing_and_mismatched_outputs_are_refused():
    z = fastpath.self_check("z", "cpu", "cfg", lambda on: torch.zeros(4))
    assert not z.chosen and "all zero" in z.reason
    m = fastpath.self_check("m", "cpu", "cfg", lambda on: [_x()] * (2 if on else 1))
    assert not m.chosen and "other outputs" in m.reason
    s = fastpath.self_check("s", "cpu", "cfg", lambda on: _x()[: 3 if on else 4])
    assert not s.chosen and "shape" in s.reason
    with pytest.raises(TypeError):
        fastpath.compare("a", "a")


def test_user_override_and_not_applicable_run_nothing(monkeypatch):
    t = Counting()
    fastpath.force_reference(True)
    v = fastpath.self_check("p", "cpu", "cfg", t)
    assert not v.chosen and "forced by the user" in v.reason and t.calls == []
    fastpath.force_reference(None)
    monkeypatch.setenv(fastpath.ENV_FORCE, "1")
    assert fastpath.reference_forced() and not fastpath.self_check("p", "cpu", "cfg", t).chosen
    fastpath.force_reference(False)                 # the call wins over the environment
    assert fastpath.self_check("p", "cpu", "cfg", t).chosen
    n = fastpath.self_check("q", "cpu", "cfg", t, not_applicable="the CPU runs frame by frame")
    assert not n.chosen and n.reason == "not applicable: the CPU runs frame by frame"


def test_key_names_device_libraries_and_config():
    env = fastpath.environment("cpu")
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    k1 = fastpath.cache_key("p", "cpu", ("cfg", 1))
    assert k1 != fastpath.cache_key("p", "cpu", ("cfg", 2)) != fastpath.cache_key("p2", "cpu", ("cfg", 2))
    assert json.loads(k1)["env"]["torch"] == torch.__version__
    assert json.loads(k1)["code"] == fastpath.code_hash(())                 # no code named: the empty hash
    assert json.loads(fastpath.cache_key("p", "cpu", ("cfg", 1), ["engine.core"]))["code"] != json.loads(k1)["code"]


def test_disk_cache_survives_the_process_cache(tmp_path, monkeypatch):
    f = tmp_path / "sub" / "fastpath.json"
    monkeypatch.setenv(fastpath.ENV_CACHE, str(f))
    t = Counting(ulp=True)
    v = fastpath.self_check("p", "cpu", "cfg", t)
    assert not v.chosen and f.is_file()
    fastpath.clear_cache()                          # a new process, as far as verdicts go
    again = fastpath.self_check("p", "cpu", "cfg", t)
    assert again.cached and not again.chosen and again.reason == v.reason and len(t.calls) == 3
    f.write_text("{not json")                       # a damaged file: checked again and rewritten
    fastpath.clear_cache()
    assert not fastpath.self_check("p", "cpu", "cfg", t).cached and len(t.calls) == 6
    assert json.loads(f.read_text())
    monkeypatch.setenv(fastpath.ENV_CACHE, "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fastpath.disk_cache_file() == tmp_path / "xdg" / "duplexcadence" / "fastpath.json"


def test_verdict_line_and_dict():
    v = Verdict("batched convs", True, "bit-identical to the reference (2 tensors, 10 values)", 0.0)
    assert v.line() == "batched convs: on — bit-identical to the reference (2 tensors, 10 values)"
    assert v.as_dict()["chosen"] is True and fastpath.lines([v]) == [v.line()]
    where = Verdict("fused elementwise", True, "bit-identical", 0.0, scope=fastpath.CAPTURED_ONLY)
    assert where.line() == "fused elementwise: on (inside captured graphs only) — bit-identical"
    assert Verdict("p", False, "max abs diff 1e-07", scope=fastpath.CAPTURED_ONLY).line() == "p: off — max abs diff 1e-07"


def test_decide_for_checks_that_compare_on_their_own():
    calls = []

    def check():
        calls.append(1)
        return len(calls) == 1, "3 batched steps over 3 slots equal each session's solo steps"
    v = fastpath.decide("batched LISTEN (bmm)", "cpu", ("dims", 3), check)
    assert v.chosen and v.reason.startswith("3 batched steps") and v.max_abs_diff is None
    assert fastpath.decide("batched LISTEN (bmm)", "cpu", ("dims", 3), check).cached and len(calls) == 1

    def broken():
        raise ValueError("no engine found")
    b = fastpath.decide("batched LISTEN (rows)", "cpu", ("dims", 3), broken)
    assert not b.chosen and b.reason == "the check failed: ValueError: no engine found"
    fastpath.force_reference(True)
    assert "forced" in fastpath.decide("x", "cpu", "c", check).reason and len(calls) == 1
