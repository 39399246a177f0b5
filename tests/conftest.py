"""Shared fixtures: speech-like WAV files made with espeak-ng (installed by the Makefile).

``speech_wav``: ~12 s at espeak's native 22,050 Hz, mono — turns of speech separated by pauses
long enough for the duplex policy to answer. ``long_speech_wav``: the same pattern over 32 s,
written as 16 kHz stereo so the session's conversion is exercised too. Both are session-scoped;
tests that need them skip only when espeak-ng is truly absent.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

# proofs that cannot skip unseen: a missing oracle fails under CI, and every run names what did not run
from oracle_hooks import (pytest_collectreport, pytest_configure, pytest_runtest_makereport,  # noqa: F401
                          pytest_runtest_setup, pytest_terminal_summary)

SENTENCES = [
    "Hello there. Can you tell me what the weather will be like tomorrow?",
    "That sounds good. And what about the weekend?",
    "Thank you, that was very helpful.",
]


@pytest.fixture(autouse=True)
def _session_journals(tmp_path_factory, monkeypatch):
    """The app journals every session; tests keep those journals in a temporary folder (subprocesses
    inherit the variable), never in the user's data folder."""
    monkeypatch.setenv("DUPLEXCADENCE_SESSIONS", str(tmp_path_factory.mktemp("journals")))


@pytest.fixture
def fresh_fastpath(monkeypatch):
    """engine.fastpath with no cached verdicts, no override from the environment, before and after."""
    from engine import fastpath
    monkeypatch.delenv(fastpath.ENV_FORCE, raising=False)
    monkeypatch.delenv(fastpath.ENV_CACHE, raising=False)
    fastpath.clear_cache()
    fastpath.force_reference(None)
    yield fastpath
    fastpath.clear_cache()
    fastpath.force_reference(None)


@pytest.fixture
def one_torch_thread():
    """Tiny ops on a shared 2-core machine: OpenMP spin-waits dominate, so run torch on one thread
    (both sides of a comparison run alike)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _espeak(text: str, out: Path) -> tuple:
    from engine.audio import read_wav, to_mono
    subprocess.run(["espeak-ng", "-s", "165", "-w", str(out), text], check=True, capture_output=True, timeout=60)
    x, rate = read_wav(out)
    return to_mono(x), rate


def _conversation(tmp: Path, seconds: float) -> tuple:
    """Speech turns with 3 s pauses (plus a little noise), repeated until ``seconds`` long."""
    turns, rate = [], None
    for i, s in enumerate(SENTENCES):
        x, rate = _espeak(s, tmp / f"turn{i}.wav")
        turns.append(x)
    pause = np.zeros(int(3.0 * rate), dtype=np.float32)
    parts, n, i = [np.zeros(int(0.3 * rate), dtype=np.float32)], 0, 0
    while n < seconds * rate:
        parts += [turns[i % len(turns)], pause]
        n = sum(p.size for p in parts)
        i += 1
    x = np.concatenate(parts)[: int(seconds * rate)]
    x = x + np.random.default_rng(0).standard_normal(x.size).astype(np.float32) * 1e-3
    return x.astype(np.float32), rate


def _need_espeak():
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (the Makefile's sysdeps target installs it)")


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory) -> Path:
    _need_espeak()
    from engine.audio import write_wav
    tmp = tmp_path_factory.mktemp("speech")
    x, rate = _conversation(tmp, 12.0)
    return write_wav(tmp / "speech.wav", x, rate)


@pytest.fixture(scope="session")
def long_speech_wav(tmp_path_factory) -> Path:
    _need_espeak()
    from engine.audio import resample, write_wav
    tmp = tmp_path_factory.mktemp("long_speech")
    x, rate = _conversation(tmp, 32.0)
    y = resample(x, rate, 16000)
    stereo = np.stack([y, 0.5 * y], axis=1)                     # [frames, 2]
    return write_wav(tmp / "long_speech.wav", stereo, 16000)
