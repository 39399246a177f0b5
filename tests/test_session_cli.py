"""`duplexcadence run` end to end on the CPU, the cadence of the tiny sizes, and the moshi backbone
in a whole session (tiny random LM and Mimi encoder, the engine's tiny Mimi tail)."""
from __future__ import annotations

import json
import time

import numpy as np

from engine.audio import frames_of, load_mono, read_wav
from engine.cli.run import main
from engine.session import DuplexSession, SessionConfig


def _args(inp, tmp_path, *extra):
    return ["--input", str(inp), "--output", str(tmp_path / "out.wav"), "--log", str(tmp_path / "logs"),
            "--size", "tiny", "--device", "cpu", "--quiet", *extra]


def test_run_keeps_the_cadence_on_cpu(long_speech_wav, tmp_path, capsys):
    """32 s of 16 kHz stereo speech through the default tail and backbone at tiny sizes, graphs off."""
    assert main(_args(long_speech_wav, tmp_path, "--mode", "demand")) == 0
    out = capsys.readouterr()
    assert "missed" in out.out and "NOTE: synthetic weights" in out.err
    x, rate = read_wav(tmp_path / "out.wav")
    assert rate == 24000 and x.shape == (32 * 24000,)            # one second out per second in
    s = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert s["seconds"] == 32 and s["speak_seconds"] > 0 and s["tokens"] > 0
    assert s["p99_total_ms"] < 1000.0, s                          # the laptop keeps up without a GPU
    lines = (tmp_path / "logs" / "session.jsonl").read_text().splitlines()
    recs = [json.loads(l) for l in lines]
    assert len(recs) == 32 and all(r["graph_replay"] is False and r["tail"] == "step-audio2" for r in recs)
    assert (tmp_path / "logs" / "session.csv").is_file() and (tmp_path / "logs" / "session.trace.json").is_file()


def test_run_realtime_paces_input(speech_wav, tmp_path):
    t0 = time.perf_counter()
    assert main(_args(speech_wav, tmp_path, "--model", "mimi", "--realtime", "--seconds", "3")) == 0
    assert time.perf_counter() - t0 >= 2.0                          # frames 0, 1, 2 at t = 0, 1, 2 s
    recs = [json.loads(l) for l in (tmp_path / "logs" / "session.jsonl").read_text().splitlines()]
    assert [r["index"] for r in recs] == [0, 1, 2] and all(r["queue_wait_ms"] >= 0 for r in recs)
    x, rate = read_wav(tmp_path / "out.wav")
    assert x.shape[0] == 3 * 24000


def test_run_errors(speech_wav, tmp_path, capsys):
    assert main(_args(tmp_path / "missing.wav", tmp_path)) == 2
    assert "no such file" in capsys.readouterr().err.lower()
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    argv = ["--input", str(speech_wav), "--output", str(tmp_path / "o.wav"), "--log", str(blocker),
            "--size", "tiny", "--device", "cpu", "--quiet", "--model", "mimi", "--seconds", "2"]
    assert main(argv) == 2                                # refused before the session starts
    assert "--log" in capsys.readouterr().err
    assert main(_args(speech_wav, tmp_path, "--backbone", "moshi", "--model", "mimi")) == 2
    assert "weights folder" in capsys.readouterr().err


def test_moshi_session_tiny(speech_wav, tmp_path, monkeypatch):
    from test_backbone import _stub_moshi_deps, make_tiny_moshi_folder
    loaders = _stub_moshi_deps(monkeypatch)
    folder = make_tiny_moshi_folder(tmp_path, loaders, card=64, dep_q=8)    # the tiny Mimi tail's codes
    cfg = SessionConfig(tail="mimi", backbone="moshi", size="tiny", device="cpu", backbone_checkpoint=str(folder))
    s = DuplexSession(cfg)
    s.start()
    assert s.info["backbone"] == "moshi" and s.cfg.checkpoint is None     # tiny tail: its own random weights
    outs = [s.process(f)[0] for f in frames_of(load_mono(speech_wav))[:3]]
    assert all(o.shape == (24000,) and np.isfinite(o).all() for o in outs)
    r = s.records
    assert [x.backbone for x in r] == ["moshi"] * 3 and r[0].tokens < 8 * 12 and r[1].tokens == 8 * 13
    assert all(x.decision in ("listen", "speak") for x in r)
    s.close()
