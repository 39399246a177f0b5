"""A reply that ends in the session's last second: the engine's schedule decodes its last chunk first thing in the
next second, which never comes; ``held_speech`` decodes it at the end, so the speech equals the stock-like mode's
(which decodes it in its own second), and ``run``'s speech.npy holds it."""
from __future__ import annotations

import numpy as np

from engine.audio import frames_of
from engine.bench.session import speech_like
from engine.session import DuplexSession, SessionConfig


def _frames():
    talk = frames_of(speech_like(4, seed=11))[:2]                    # two seconds of talk, then a pause
    quiet = [np.full(24000, 1e-4, np.float32) for _ in range(2)]
    return talk + quiet


def _speech(demand: bool):
    s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", tail="step-audio2", size="tiny", device="cpu",
                                    seed=2, cpu_threads=1, reply_seconds=2, demand_sized=demand, graph_replay=False))
    s.start()
    parts = []
    for f in _frames():
        s.process(f)
        parts.append(s.last_speech)
    held = s.held_speech()
    decisions = [r.decision for r in s.records]
    s.close()
    return np.concatenate(parts), held, decisions


def test_the_last_chunk_held_for_a_next_second_is_decoded_at_the_end(one_torch_thread):
    stock, stock_held, decisions = _speech(False)
    ours, held, _ = _speech(True)
    assert decisions[-2:] == ["speak", "speak"]                       # the reply ends in the last second
    assert stock_held.size == 0 and held.size > 0                     # only the engine's schedule held a chunk
    assert np.array_equal(np.concatenate([ours, held]), stock)
    assert not np.array_equal(ours, stock)                            # without it the speech would end short


def test_run_writes_the_held_chunk_into_speech_npy(tmp_path, one_torch_thread):
    import subprocess
    import sys

    from engine.wavio import write_wav
    wav = tmp_path / "in.wav"
    write_wav(wav, np.concatenate(_frames()), 24000)
    speech = {}
    for mode in ("stock", "demand"):
        log = tmp_path / f"log-{mode}"
        r = subprocess.run([sys.executable, "-m", "app.main", "run", "--input", str(wav), "--output",
                            str(tmp_path / f"{mode}.wav"), "--log", str(log), "--backbone", "minicpm-o-4.5",
                            "--size", "tiny", "--device", "cpu", "--mode", mode,
                            "--seed", "2"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        speech[mode] = np.load(log / "speech.npy")
    assert speech["stock"].size and np.array_equal(speech["stock"], speech["demand"])
