"""`duplexcadence run --log` with MiniCPM-o 4.5: ``speech.npy`` holds what the tail produced,
every second concatenated (float32, 24 kHz, before playback levelling or queueing), and each second's
record carries its decision, the LLM's token ids and the TTS's codes; journals written before these
fields existed still load."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine import registry
from engine.audio import write_wav
from engine.backbones.minicpmo45.dims import preset
from engine.cli.run import main
from engine.session.config import SessionConfig
from engine.session.journal import read_records

from test_minicpmo45_weights import folder  # noqa: F401  (the tiny released-layout folder fixture)


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


def _started(folder, **kw):
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", checkpoint=str(folder),
                           turn_policy="model", **kw)
    b.start()
    return b


def _history(kv, n: int) -> list:
    """Every layer's keys and values over the first ``n`` positions, of either store kind."""
    if kv.kind == "demand":
        return [kv.k_buf[:, :, :n], kv.v_buf[:, :, :n]]
    return [torch.stack(kv.k)[:, 0, :, :n], torch.stack(kv.v)[:, 0, :, :n]]


@pytest.mark.parametrize("mode", ["stock", "graphs"])
def test_a_folder_session_starts_from_its_system_prompt(folder, mode, one_torch_thread):  # noqa: F811
    """The prelude (prompt.py) is in the LLM's history before the first second: the default system prompt,
    or the one given, wrapped as the demo wraps it; the history is exactly those ids fed as two forwards."""
    from engine.backbones.minicpmo45.kv import make_store
    from engine.backbones.minicpmo45.prompt import DEFAULT_SYSTEM_PROMPT, prelude
    mine = "You are a careful listener."
    for given, text in ((None, DEFAULT_SYSTEM_PROMPT), (mine, mine)):
        b = _started(folder, demand_sized=mode != "stock", **({} if given is None else {"system_prompt": given}))
        pre = prelude(b.folder.tokenizer, text)
        n = len(pre.prefix_ids) + len(pre.suffix_ids)
        assert pre.prefix_ids and pre.suffix_ids and b.protocol.kv_llm.length == n
        kv = make_store(False, b.llm_regions[0], b.dims.llm.layers, b.llm_capacity, "cpu", growable=True)
        with torch.no_grad():
            b.llm(b.llm.embed(pre.prefix_ids), kv)
            b.llm(b.llm.embed(pre.suffix_ids), kv)
        got, want = _history(b.protocol.kv_llm, n), _history(kv, n)
        assert got[0].shape == want[0].shape and all(torch.equal(x, y) for x, y in zip(got, want))
        b.close()


def test_system_prompt_option_reaches_the_config(tmp_path, capsys):
    from engine.cli.run import build_parser, make_config
    a = build_parser().parse_args(["--input", "in.wav", "--output", "o.wav", "--log", "d", "--backbone",
                                   "minicpm-o-4.5", "--device", "cpu", "--system-prompt", "Be brief."])
    assert make_config(a).system_prompt == "Be brief."
    other = next(n for n in registry.backbone_names() if n != "minicpm-o-4.5")
    tail = registry.get_backbone(other).tails[0] if registry.get_backbone(other).tails else registry.default_tail()
    with pytest.raises(ValueError, match="system prompt is for the minicpm-o-4.5 backbone"):
        SessionConfig(backbone=other, tail=tail, device="cpu", system_prompt="x").resolved()
