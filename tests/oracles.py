"""The test oracles that are not the product: where each one lies, whether it is there, and what its absence does.

A proof against an oracle asks for it with :func:`require` (inside a test or fixture), with the :func:`needs` mark
(checked before the test runs, by ``conftest.py``), or with :func:`require_module` at a module's top. Where one is
missing:

* under CI (``CI`` set to true, as ``.ci/run`` sets it; ``../shared/oracles`` laid beside the clone) the test
  fails, with one line saying what is missing and where it comes from;
* elsewhere it is skipped with that line as its reason, and ``make test`` ends with one line per proof that did
  not run (``conftest.py``'s terminal summary).

The oracles: the MiniCPM-o demo copy under ``../shared/oracles``, the stock loop's own venv (``.venv-stock``), and
the peer packages ``tests/oracle-requirements.txt`` and the test extra install (minicpmo's Step-Audio2 and its
s3tokenizer, moshi, nemo, transformers, tokenizers, Triton's interpreter).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what a GPU test module says where it skips for want of CUDA (not named among the tests that did not run)
NO_CUDA = ("needs CUDA", "no CUDA device")
SHARED = ROOT.parent / "shared" / "oracles"
MARK = "needs_oracles"


def in_ci() -> bool:
    """True where ``CI`` says so (``true``, ``1``, ``yes``): there no proof may be skipped for a missing oracle."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@dataclass(frozen=True)
class Oracle:
    name: str                                   # for people: "the MiniCPM-o demo copy"
    present: Callable[[], bool]
    source: str                                 # where it comes from, when missing

    def missing(self) -> str:
        """'' when present, else one line: what is missing and where it comes from."""
        try:
            ok = bool(self.present())
        except Exception:                       # a broken install is a missing oracle too
            ok = False
        return "" if ok else f"{self.name} ({self.source})"


def _modules(*names: str) -> Callable[[], bool]:
    def present() -> bool:
        for n in names:
            importlib.import_module(n)
        return True
    return present


def _found(*names: str) -> Callable[[], bool]:
    return lambda: all(importlib.util.find_spec(n) is not None for n in names)


def _stepaudio2() -> bool:
    import stock_step_audio2
    return stock_step_audio2.available()


def _moshi() -> bool:
    import stock_mimi
    return stock_mimi.available()


def _nemo() -> bool:
    from engine.models.nemotron_codec import peer
    return peer.available()


DEMO = Oracle("the MiniCPM-o demo copy " + str(SHARED / "MiniCPM-o-Demo-28b60cf"),
              lambda: (SHARED / "MiniCPM-o-Demo-28b60cf" / "MiniCPMO45").is_dir(),
              "CI lays ../shared/oracles beside the clone")
STOCK_VENV = Oracle("the stock loop's venv .venv-stock", lambda: (ROOT / ".venv-stock" / "bin" / "python").exists(),
                    "make test builds it from tests/stock-loop-requirements.txt")
STEPAUDIO2 = Oracle("the stock Step-Audio2 token2wav (minicpmo 0.1.2's stepaudio2)", _stepaudio2,
                    "tests/oracle-requirements.txt, installed by make")
S3TOKENIZER = Oracle("s3tokenizer (minicpmo 0.1.2's)", _found("s3tokenizer"), "tests/oracle-requirements.txt")
MOSHI = Oracle("moshi's Mimi and einops", _moshi, "tests/oracle-requirements.txt")
NEMO = Oracle("nemo-toolkit's EAR-TTS codec and omegaconf", _nemo, "tests/oracle-requirements.txt")
TRANSFORMERS = Oracle("transformers", _modules("transformers"), "the test extra: pip install -e '.[test]'")
TOKENIZERS = Oracle("tokenizers", _modules("tokenizers"), "the test extra: pip install -e '.[test]'")
TRITON = Oracle("Triton (its interpreter runs the fused kernels on the CPU)", _modules("triton"),
                "the test extra on Linux: pip install -e '.[test]'")


def missing(*oracles: Oracle) -> str:
    """One line naming every missing oracle of ``oracles`` ('' when all are there)."""
    return "; ".join(w for w in (o.missing() for o in oracles) if w)


def require(*oracles: Oracle) -> None:
    """Inside a test or fixture: go on where every oracle is there; otherwise fail under CI, else skip."""
    why = missing(*oracles)
    if why:
        message = f"missing test oracle: {why}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def require_module(*oracles: Oracle) -> None:
    """At a test module's top: as :func:`require`, the whole module skipped (elsewhere than CI)."""
    why = missing(*oracles)
    if why:
        message = f"missing test oracle: {why}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)


def needs(*oracles: Oracle) -> pytest.MarkDecorator:
    """A mark: the test needs ``oracles`` (checked by :func:`require` before it runs)."""
    return getattr(pytest.mark, MARK)(*oracles)


def marked(item) -> Tuple[Oracle, ...]:
    """The oracles an item's :func:`needs` marks name."""
    return tuple(o for m in item.iter_markers(MARK) for o in m.args)
