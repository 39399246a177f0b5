"""pytest hooks that keep the proofs from skipping unseen (loaded by ``conftest.py``; a plugin: ``-p oracle_hooks``).

* Before a test runs, the oracles its ``needs`` marks name are required (:func:`oracles.require`).
* Under CI a proof — a test marked ``oracle`` or ``bits``, or one that needs an oracle — that skips anyway (a
  skip inside it, an ``importorskip``) fails instead, its skip reason on one line. A GPU-marked test may skip
  where there is no CUDA.
* Elsewhere the run ends with one line per test that did not run and why (GPU tests without CUDA aside).
"""
from __future__ import annotations

from typing import List, Tuple

import pytest

import oracles

#: (test or module id, reason) of what did not run, in order
NOT_RUN: List[Tuple[str, str]] = []


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"{oracles.MARK}(*oracles): needs these test oracles (tests/oracles.py)")


def pytest_runtest_setup(item) -> None:
    need = oracles.marked(item)
    if need:
        oracles.require(*need)


def _reason(rep) -> str:
    r = rep.longrepr
    if isinstance(r, tuple) and len(r) == 3:
        return str(r[2]).removeprefix("Skipped: ")
    return str(r).strip().splitlines()[-1] if r else "skipped"


def _no_cuda() -> bool:
    import torch
    return not torch.cuda.is_available()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.skipped or hasattr(rep, "wasxfail"):
        return
    reason = _reason(rep)
    if item.get_closest_marker("gpu") is not None and _no_cuda():
        return
    proof = any(item.get_closest_marker(m) for m in ("oracle", "bits")) or bool(oracles.marked(item))
    if proof and oracles.in_ci():
        rep.outcome = "failed"
        rep.longrepr = f"a proof may not skip under CI: {reason}"
        return
    NOT_RUN.append((item.nodeid, reason))


def pytest_collectreport(report) -> None:
    if report.skipped:
        reason = _reason(report)
        if reason in oracles.NO_CUDA and _no_cuda():        # a GPU module without CUDA
            return
        NOT_RUN.append((report.nodeid or "(collection)", reason))


def pytest_terminal_summary(terminalreporter) -> None:
    if not NOT_RUN:
        return
    n = len(NOT_RUN)
    terminalreporter.write_sep("-", f"{n} test{'s' if n != 1 else ''} did not run")
    for nodeid, reason in NOT_RUN:
        terminalreporter.write_line(f"did not run: {nodeid}: {reason}")
