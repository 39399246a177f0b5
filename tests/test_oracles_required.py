"""A proof cannot skip unseen: under CI a missing oracle fails its test with one line saying what is missing,
elsewhere the run ends naming each test that did not run and why; a GPU test may skip where there is no CUDA.

Each case runs an inner pytest session over a small test file with this suite's hooks (``-p oracle_hooks``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import oracles

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import pytest
import oracles

GONE = oracles.Oracle("the gone oracle", lambda: False, "nowhere to be had")
BROKEN = oracles.Oracle("the broken oracle", lambda: 1 / 0, "a broken install")
HERE = oracles.Oracle("the present oracle", lambda: True, "here")


@pytest.mark.oracle
def test_asks_for_a_missing_oracle():
    oracles.require(GONE, HERE)


@oracles.needs(BROKEN)
def test_is_marked_with_a_broken_oracle():
    pass


@pytest.mark.bits
def test_a_bits_proof_skips_itself():
    pytest.skip("a peer package would not import")


@pytest.mark.gpu
def test_a_gpu_proof_without_cuda():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def test_has_its_oracle():
    oracles.require(HERE)


def test_skips_for_another_reason():
    pytest.skip("no mount point to aim at")
'''


def _inner(tmp_path: Path, ci: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    oracle\n    bits\n    gpu\n")
    env = dict(os.environ, CI=ci, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "oracle_hooks", "-p", "no:cacheprovider", "-q",
                           "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_inner.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_under_ci_a_missing_oracle_fails_with_one_line_naming_it(tmp_path):
    r = _inner(tmp_path, "true")
    out = r.stdout
    assert r.returncode == 1, out
    assert "missing test oracle: the gone oracle (nowhere to be had)" in out
    assert "missing test oracle: the broken oracle (a broken install)" in out
    assert "a proof may not skip under CI: a peer package would not import" in out
    assert "2 failed" in out and "1 error" in out, out          # the mark's check fails the setup: an error
    assert "present oracle" not in out.replace("test_has_its_oracle", "")
    if not torch.cuda.is_available():
        assert "did not run: test_inner.py::test_a_gpu_proof_without_cuda" not in out
    assert "did not run: test_inner.py::test_skips_for_another_reason: no mount point to aim at" in out


def test_elsewhere_the_run_ends_naming_each_test_that_did_not_run(tmp_path):
    r = _inner(tmp_path, "")
    out = r.stdout
    assert r.returncode == 0, out
    tail = out[out.index(" did not run -"):].splitlines()
    assert "did not run: test_inner.py::test_asks_for_a_missing_oracle: missing test oracle: the gone oracle " \
           "(nowhere to be had)" in tail
    assert "did not run: test_inner.py::test_is_marked_with_a_broken_oracle: missing test oracle: the broken " \
           "oracle (a broken install)" in tail
    assert "did not run: test_inner.py::test_a_bits_proof_skips_itself: a peer package would not import" in tail
    assert "did not run: test_inner.py::test_skips_for_another_reason: no mount point to aim at" in tail
    assert not any("test_has_its_oracle" in line or "gpu_proof" in line for line in tail) or \
        torch.cuda.is_available()


def test_ci_is_read_from_the_environment(monkeypatch):
    for value, ci in (("true", True), ("1", True), ("TRUE", True), ("", False), ("false", False)):
        monkeypatch.setenv("CI", value)
        assert oracles.in_ci() is ci
    monkeypatch.delenv("CI")
    assert not oracles.in_ci()


def test_ci_script_sets_ci():
    text = (ROOT / ".ci" / "run").read_text()
    assert "export CI=true" in text.replace("'", "").replace('"', "")


@pytest.mark.parametrize("oracle", [oracles.DEMO, oracles.STOCK_VENV, oracles.STEPAUDIO2, oracles.MOSHI,
                                    oracles.NEMO], ids=lambda o: o.name.split()[1])
def test_every_oracle_says_where_it_comes_from(oracle):
    assert oracle.source and oracle.name
    gone = oracles.Oracle(oracle.name, lambda: False, oracle.source)
    assert gone.missing() == f"{oracle.name} ({oracle.source})"
