"""A model whose weights are out of range (every weight scaled by 1e30: still finite, so they load) computes
infinities and NaN. The session looks once a second at what leaves a model and stops in one line naming it,
exit 1, no garbage written: the tail's audio (any tail, any backbone) and MiniCPM-o's decision logits."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from engine.finite import NonFiniteOutput, check_audio, check_logits
from engine.wavio import write_wav

SCALE = 1e30


def test_the_checks_pass_finite_values_and_name_what_is_not():
    check_audio(np.zeros(10, np.float32), "x")
    check_logits(torch.zeros(1, 5), "y")
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(NonFiniteOutput, match="second 3: the tail's audio holds NaN or infinite values"):
            check_audio(np.array([0.0, bad], np.float32), "second 3: the tail's audio")
        with pytest.raises(NonFiniteOutput, match="the LLM's decision logits holds NaN"):
            check_logits(torch.tensor([[0.0, bad]]), "the LLM's decision logits")


def _scaled_step_audio2(folder, tiny_state) -> None:
    from test_step_audio2_io import _write_checkpoint
    _write_checkpoint(folder, {k: v * SCALE if v.dtype.is_floating_point else v for k, v in tiny_state.items()})


@pytest.mark.parametrize("realtime", [False, True])
def test_a_tail_with_weights_out_of_range_stops_the_run_in_one_line(tmp_path, capsys, realtime):
    from engine.cli.run import main as run_main
    from engine.models.step_audio2 import weights as W
    from engine.models.step_audio2.config import preset
    ckpt = tmp_path / "t2w"
    ckpt.mkdir()
    _scaled_step_audio2(ckpt, W.random_state_dict(preset("tiny"), seed=2))
    wav = write_wav(tmp_path / "in.wav", 0.1 * np.random.default_rng(0).standard_normal(3 * 24000), 24000)
    rc = run_main(["--input", str(wav), "--output", str(tmp_path / "o.wav"), "--log", str(tmp_path / "log"),
                   "--model", "step-audio2", "--checkpoint", str(ckpt), "--size", "tiny", "--device", "cpu",
                   "--quiet"] + (["--realtime"] if realtime else []))
    text = capsys.readouterr().err
    err = [ln for ln in text.splitlines() if "error" in ln]
    assert rc == 1 and len(err) == 1 and "Traceback" not in text, text[-3000:]
    assert "the step-audio2 tail's audio holds NaN or infinite values" in err[0]
    from engine.session.journal import read_records
    from engine.wavio import read_wav
    kept = len(read_records(tmp_path / "log" / "session.jsonl"))  # the seconds before the first broken one
    assert read_wav(tmp_path / "o.wav")[0].size == kept * 24000 and f"second {kept}:" in err[0]


def test_minicpm_decision_logits_out_of_range_stop_the_second(tmp_path, one_torch_thread):
    pytest.importorskip("tokenizers")
    from engine.vad import VadResult
    from minicpmo45_stock_folder import write_shards
    from test_minicpmo45_weights import _config, _tokenizer, _weights, _backbone
    p = tmp_path / "MiniCPM-o-4_5"
    p.mkdir()
    (p / "config.json").write_text(json.dumps(_config(), indent=2))
    (p / "added_tokens.json").write_text(json.dumps(_tokenizer(p)))
    write_shards(p, {k: v * SCALE if v.dtype.is_floating_point else v for k, v in _weights().items()})
    b = _backbone(p)
    x = torch.from_numpy((np.random.default_rng(0).standard_normal(24000) * 0.1).astype(np.float32))
    with pytest.raises(NonFiniteOutput, match="the LLM's decision logits holds NaN or infinite values"):
        b.listen(x, VadResult(True, 1.0, 0.0, -70.0))
        b.think(25)
    shutil.rmtree(p)
