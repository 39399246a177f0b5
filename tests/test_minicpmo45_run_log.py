"""`duplexcadence run --log` with MiniCPM-o 4.5 (issue 21, item 3): ``speech.npy`` holds what the tail produced,
every second concatenated (float32, 24 kHz, before playback levelling or queueing), and each second's
record carries its decision, the LLM's token ids and the TTS's codes; journals written before these
fields existed still load."""
from __future__ import annotations

import json

import numpy as np

from engine.audio import write_wav
from engine.backbones.minicpmo45.dims import preset
from engine.cli.run import main
from engine.session.journal import read_records


def _speech_then_pause(seconds: int = 6) -> np.ndarray:
    rng = np.random.RandomState(7)
    x = np.zeros(seconds * 24000, dtype=np.float32)
    t = np.arange(2 * 24000) / 24000
    x[: t.size] = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
                   + 0.05 * rng.randn(t.size)).astype(np.float32)
    return x


def test_run_log_writes_speech_and_per_second_ids(tmp_path, one_torch_thread):
    wav = write_wav(tmp_path / "in.wav", _speech_then_pause(), 24000)
    log = tmp_path / "log"
    rc = main(["--backbone", "minicpm-o-4.5", "--size", "tiny", "--device", "cpu", "--mode", "stock", "--quiet",
               "--seed", "3", "--input", str(wav), "--output", str(tmp_path / "out.wav"), "--log", str(log)])
    assert rc == 0
    speech = np.load(log / "speech.npy")
    assert speech.dtype == np.float32 and speech.ndim == 1
    records = read_records(log / "session.jsonl")
    assert len(records) == 6
    tk = preset("tiny").tokens
    spoken = [r for r in records if r.decision == "speak"]
    assert spoken, "the voice-activity policy answers the tone"
    for r in records:
        ids = [int(i) for i in r.llm_tokens.split()]
        assert ids and ids[0] == (tk.speak if r.decision == "speak" else tk.listen)
        codes = [int(c) for c in r.tts_codes.split()]
        assert len(codes) == r.tokens and all(0 <= c < 6561 for c in codes)
    assert sum(r.tokens for r in spoken) > 0
    # what the tail produced, unlevelled: random weights decode near full scale, the output WAV is levelled
    assert speech.size > 0 and float(np.sqrt(np.mean(speech ** 2))) > 0.0


def test_journals_without_the_new_fields_still_load(tmp_path):
    line = {"index": 0, "wall_start": 1.0, "listen_ms": 1.0, "think_ms": 1.0, "speak_ms": 1.0, "total_ms": 3.0,
            "deadline_ms": 1000.0, "late_ms": 0.0, "missed": False, "queue_wait_ms": 0.0, "decision": "listen",
            "tokens": 0, "state_bytes": 0, "alloc_bytes": 0, "reserved_bytes": 0, "peak_bytes": 0,
            "demand_sized": True, "graph_replay": False, "tail": "step-audio2", "backbone": "minicpm-o-4.5",
            "input_rms": 0.0, "output_rms": 0.0}
    p = tmp_path / "session.jsonl"
    p.write_text(json.dumps(line) + "\n")
    (r,) = read_records(p)
    assert r.llm_tokens == "" and r.tts_codes == "" and r.decision == "listen"
