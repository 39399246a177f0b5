"""The session bench says where two runs part (CPU, tiny MiniCPM-o 4.5): per-second digests of every stage,
and the first differing second / stage / item found for an error planted in one mode only — an ulp in one
TTS logit (codes, text and audio stay the same: only the digests see it) and a changed LLM token."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.audio import frames_of
from engine.backbones.minicpmo45.protocol import Protocol
from engine.backbones.minicpmo45.tts import TTS
from engine.bench.digests import STAGES, StageTap, describe, divergence
from engine.bench.session import main, run_mode, speech_like
from engine.session.config import SessionConfig

SECONDS = 7                      # seconds 0-3 listen, 4-6 answer (the speech-like input's first pause)


def _cfg(demand: bool) -> SessionConfig:
    return SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=0, demand_sized=demand,
                         graph_replay=False, cpu_threads=1).resolved()


def _frames():
    return frames_of(speech_like(SECONDS, 0))[:SECONDS]


def _ulp_in_tts_logits(monkeypatch, call: int = 3):
    """The ``call``-th TTS decode step over a demand store (the first answer's step ``call``) moves one
    logit by an ulp; the stock-like store's steps are left alone."""
    step, calls = TTS.step_code, []

    def planted(self, code, kv):
        out = step(self, code, kv)
        if kv.kind == "demand":
            calls.append(1)
            if len(calls) == call:
                out = out.clone()
                out[0, 7] = torch.nextafter(out[0, 7], torch.tensor(float("inf")))
        return out
    monkeypatch.setattr(TTS, "step_code", planted)


def _other_token(monkeypatch, call: int = 2):
    """Over the demand LLM store, the ``call``-th decode step's logits (listening seconds run none) favour
    another token."""
    step_ids, calls = Protocol.step_ids, []

    def planted(self, ids, logits):
        h, lg = step_ids(self, ids, logits)
        if lg is not None and self.kv_llm.kind == "demand":
            calls.append(1)
            if len(calls) == call:
                lg = lg.clone()
                lg[0, int(lg.argmin())] = lg.max() + 50.0
        return h, lg
    monkeypatch.setattr(Protocol, "step_ids", planted)


@pytest.fixture(scope="module")
def stock():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield run_mode(_cfg(False), _frames())
    finally:
        torch.set_num_threads(n)


def test_every_stage_is_digested_each_second_and_identical_runs_agree(stock, one_torch_thread):
    d = stock["digests"]
    assert [s["second"] for s in d] == list(range(SECONDS))
    speak = [s for s in d if s["decision"] == "speak"]
    assert speak and speak[0]["second"] == 4
    assert set(speak[0]["stages"]) == set(STAGES)
    assert len(speak[0]["stages"]["llm_logits"]) > 2 and len(speak[0]["stages"]["tts_logits"]) >= 2
    assert set(d[0]["stages"]) == {"encoder", "llm_logits", "text", "audio"}     # a listening second
    again = run_mode(_cfg(True), _frames())
    div = divergence(d, again["digests"])
    assert div["second"] is None and div["seconds"] == SECONDS and not any(div["by_stage"].values())
    assert "identical to stock-like at every stage over 7 s" in describe("demand", "stock-like", div)


def test_an_ulp_in_one_tts_logit_is_found_where_the_audio_cannot_see_it(stock, monkeypatch, one_torch_thread):
    _ulp_in_tts_logits(monkeypatch)
    planted = run_mode(_cfg(True), _frames())
    assert np.array_equal(planted["audio"], stock["audio"])          # the waveform says nothing ...
    div = divergence(stock["digests"], planted["digests"])
    assert (div["second"], div["stage"], div["item"]) == (4, "tts_logits", 3)   # ... the digests name the step
    assert all(div["by_stage"][s] is None for s in ("encoder", "llm_logits", "text", "codes", "tokens", "audio"))
    assert div["l1"] != div["ref_l1"]


def test_a_changed_token_is_found_at_its_logits_and_every_later_stage(stock, monkeypatch, one_torch_thread):
    _other_token(monkeypatch)
    planted = run_mode(_cfg(True), _frames())
    div = divergence(stock["digests"], planted["digests"])
    assert (div["second"], div["stage"], div["item"]) == (4, "llm_logits", 2)   # item 0: after the prefill
    assert div["by_stage"]["encoder"] is None
    assert div["by_stage"]["text"] == 4 and div["by_stage"]["tts_logits"] == 4   # the TTS reads the text
    line = describe("graphs", "stock-like", div)
    assert line.startswith(f"graphs vs stock-like: first difference at second 4, stage llm_logits #{div['item']}")
    assert "text from 4" in line


def test_bench_json_and_terminal_name_the_first_difference(tmp_path, capsys, monkeypatch, one_torch_thread):
    _ulp_in_tts_logits(monkeypatch)
    rc = main(["--seconds", str(SECONDS), "--backbone", "minicpm-o-4.5", "--size", "tiny", "--device", "cpu",
               "--modes", "stock,graphs,graphs", "--flip-seconds", "0", "--quiet", "--out", str(tmp_path)])
    assert rc == 0                                                    # the audio is still identical
    out = capsys.readouterr().out
    assert "first difference at second 4, stage tts_logits" in out
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["divergence"]["graphs"]["stage"] == "tts_logits" and doc["divergence"]["graphs"]["second"] == 4
    assert doc["divergence"]["graphs-2"]["second"] is None        # the plant fired once: the repeat is clean ...
    assert doc["divergence"]["graphs-2 vs graphs"]["stage"] == "tts_logits"   # ... and differs from run 1
    assert doc["modes"]["graphs-2"]["label"].endswith("#2")
    lines = (tmp_path / "session-graphs-digests.jsonl").read_text().splitlines()
    assert len(lines) == SECONDS and json.loads(lines[4])["decision"] == "speak"


def test_divergence_on_hand_made_records():
    def rec(k, **stages):
        return {"second": k, "decision": "speak", "stages": {s: list(v) for s, v in stages.items()},
                "l1": {"llm_logits": [1.0, 2.0, 3.0]}}
    a = [rec(0, encoder="a", llm_logits="xyz"), rec(1, encoder="b", llm_logits="xyz", audio="q")]
    b = [rec(0, encoder="a", llm_logits="xyz"), rec(1, encoder="b", llm_logits="xyw", audio="r")]
    d = divergence(a, b)
    assert (d["second"], d["stage"], d["item"]) == (1, "llm_logits", 2)
    assert d["by_stage"]["audio"] == 1 and d["by_stage"]["encoder"] is None
    tap = StageTap()
    tap("codes", torch.tensor([1, 2, 3]))
    s = tap.second(0, "speak", "<1>", np.zeros(4, np.float32))
    assert set(s["stages"]) == {"codes", "text", "audio"} and not tap.items
