"""THINK split at the TTS (records.think_tts_ms): MiniCPM-o marks where its TTS starts on the session's stage
clock; a speaking second's record carries the TTS part inside its THINK, a listening one none; the bench's means
and slowest-second line show it."""
from __future__ import annotations

import numpy as np

from engine.bench.session import format_slowest, stage_means
from engine.session.config import SessionConfig
from engine.session.session import DuplexSession


def test_speaking_seconds_carry_their_tts_part(one_torch_thread):
    s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=3))
    s.start()
    rng = np.random.default_rng(0)
    for sp in (1, 0, 0, 1, 0):
        s.process((rng.standard_normal(24000) * (0.2 if sp else 0.001)).astype(np.float32))
    recs = list(s.records)
    s.close()
    speak = [r for r in recs if r.decision == "speak"]
    assert speak and all(0 < r.think_tts_ms < r.think_ms for r in speak)
    assert all(r.think_tts_ms == 0.0 for r in recs if r.decision != "speak")
    means = stage_means(recs)
    assert 0 < means["mean_think_tts_ms_speaking"] < means["mean_think_ms_speaking"]
    r = speak[0]
    line = format_slowest("graphs", {"index": r.index, "decision": r.decision, "total_ms": r.total_ms,
                                     "listen_ms": r.listen_ms, "think_ms": r.think_ms, "think_tts_ms": r.think_tts_ms,
                                     "speak_ms": r.speak_ms, "captures": 0, "gc_ms": 0.0})
    assert f"(TTS {r.think_tts_ms:.1f})" in line


def test_other_backbones_leave_it_at_zero(one_torch_thread):
    s = DuplexSession(SessionConfig(backbone="synthetic", size="tiny", device="cpu", seed=3))
    s.start()
    for _ in range(3):
        s.process(np.zeros(24000, dtype=np.float32))
    assert all(r.think_tts_ms == 0.0 for r in s.records)
    s.close()
