"""Backbones on the CPU: the synthetic AR decoder on the engine, the turn policy, the VAD, the
listen features, and the moshi backbone with a tiny random LM (moshi imported only when chosen)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import oracles

from engine.audio import frames_of, load_mono
from engine.backbones import TokenFormat, make_backbone
from engine.backbones.moshi.files import validate_folder
from engine.backbones.policy import LISTEN, SPEAK, TurnPolicy
from engine.backbones.speech_decoder import SpeechDecoder, decoder_args
from engine.backbones.synthetic import AudioEmbedder, mel_filterbank
from engine.core import Executor, make_plan
from engine.vad import EnergyVAD, VadResult
from engine.core.toggles import Toggles

S2 = TokenFormat(codebooks=1, vocab=6561, rate_hz=25.0)
MIMI = TokenFormat(codebooks=8, vocab=2048, rate_hz=12.5)


def _decode(args, inputs, flips=None, seed=0):
    """Run the decoder over ``inputs`` one step each; ``flips[i]`` = demand_sized for step i."""
    torch.manual_seed(seed)
    m = SpeechDecoder(args, seed=3).eval()
    spec = m.session_spec()
    ex = Executor(m, make_plan(m.regions(spec), spec), "cpu", demand_sized=True)
    ex.init_state({})
    toks = []
    with torch.no_grad():
        for i, x in enumerate(inputs):
            if flips is not None:
                ex.set_toggles(Toggles(demand_sized=flips[i], graph_replay=False))
            toks.append(ex.step({"x": x})["tok"])
    return torch.stack(toks), ex


def test_decoder_modes_bit_identical():
    args = decoder_args("tiny", S2.vocab, 1)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(1, 1, args.dim, generator=g) for _ in range(12)]
    fixed, ex = _decode(args, inputs)
    flipped, ex2 = _decode(args, inputs, flips=[i % 2 == 1 for i in range(12)])
    assert torch.equal(fixed, flipped)
    assert ex2.stats.migrations >= 10
    assert fixed.dtype == torch.int64 and fixed.shape == (12, 1)
    assert ex.state_bytes() == 2 * args.n_layers * args.n_heads * args.context * args.head_dim * 4


def test_decoder_ring_masks_unwritten_slots_and_wraps():
    a_small = decoder_args("tiny", 64, 2)
    a_small = type(a_small)(**{**a_small.__dict__, "context": 8})
    a_big = type(a_small)(**{**a_small.__dict__, "context": 64})
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(1, 1, a_small.dim, generator=g) for _ in range(20)]
    small, _ = _decode(a_small, inputs)
    big, _ = _decode(a_big, inputs)
    # before the ring wraps the masked slots change nothing (same tokens); after, the window differs
    assert torch.equal(small[:8], big[:8])
    assert small.shape == (20, 2) and int(small.max()) < 64 and int(small.min()) >= 0


def test_turn_policy():
    p = TurnPolicy(reply_seconds=3)
    talk = [1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0]
    got = [p.decide(bool(t)) for t in talk]
    # answers a 2 s turn with 2 s, stays quiet after; barge-in at index 9 cuts the 1 s answer short
    assert got == [LISTEN, LISTEN, SPEAK, SPEAK, LISTEN, LISTEN, LISTEN, LISTEN, SPEAK, LISTEN, SPEAK, LISTEN]
    p = TurnPolicy(reply_seconds=2)
    got = [p.decide(bool(t)) for t in [1, 1, 1, 1, 1, 0, 0, 0, 1, 0]]
    assert got[5:8] == [SPEAK, SPEAK, LISTEN] and p.barge_ins == 0
    got = [p.decide(bool(t)) for t in [1, 1, 0, 1]]
    assert got == [LISTEN, LISTEN, SPEAK, LISTEN] and p.barge_ins == 1


def test_vad_on_speech(speech_wav):
    frames = frames_of(load_mono(speech_wav))
    vad = EnergyVAD()
    flags = [vad(f).speech for f in frames]
    assert any(flags) and not all(flags)
    quiet = EnergyVAD()
    rng = np.random.default_rng(0)
    assert not any(quiet(rng.standard_normal(24000).astype(np.float32) * 1e-3).speech for _ in range(3))
    assert not EnergyVAD()(np.zeros(24000, np.float32)).speech


def test_listen_features():
    fb = mel_filterbank(1201, 80, 24000)
    assert fb.shape == (1201, 80) and float(fb.min()) >= 0 and float(fb.max()) <= 1.0 + 1e-6
    assert bool((fb.sum(0) > 0).all())
    emb = AudioEmbedder(32)
    out = emb(torch.randn(24000))
    assert out.shape == (10, 1, 1, 32) and torch.isfinite(out).all()


@pytest.mark.parametrize("fmt", [S2, MIMI], ids=["step-audio2", "mimi"])
def test_synthetic_backbone_contract(fmt):
    b = make_backbone("synthetic", fmt, size="tiny", device="cpu", seed=1, graph_replay=True)
    b.start()
    assert b.info.synthetic and "random" in b.info.title
    assert b.toggles() == {"demand_sized": True, "graph_replay": False}    # no CUDA here
    talk = [True, True, False, False, True]
    out = []
    for k, t in enumerate(talk):
        b.listen(torch.randn(24000) * 0.1, VadResult(t, 0.5, -20.0, -60.0))
        out.append(b.think(fmt.frames_in_second(k)))
    assert [o.decision for o in out] == [LISTEN, LISTEN, SPEAK, SPEAK, LISTEN]
    assert out[0].tokens is None and out[0].produced == 0
    t = out[2].tokens
    assert t.shape == (fmt.codebooks, fmt.frames_in_second(2)) and t.dtype == torch.int64
    assert int(t.min()) >= 0 and int(t.max()) < fmt.vocab
    assert out[3].produced == fmt.codebooks * fmt.frames_in_second(3)
    assert b.state_bytes() > 0


def test_frames_in_second():
    assert [MIMI.frames_in_second(k) for k in range(4)] == [12, 13, 12, 13]
    assert {S2.frames_in_second(k) for k in range(5)} == {25}


# -- moshi -----------------------------------------------------------------------------------------

def _stub_moshi_deps(monkeypatch):
    """moshi is a --no-deps test oracle here: stand in for the hub client and sentencepiece if absent."""
    import types
    for name in ("huggingface_hub", "huggingface_hub.errors", "sentencepiece"):
        try:
            __import__(name)
        except ImportError:
            m = types.ModuleType(name)
            m.hf_hub_download = m.SentencePieceProcessor = None
            m.EntryNotFoundError = Exception
            monkeypatch.setitem(sys.modules, name, m)
    oracles.require(oracles.MOSHI)
    import moshi.models.loaders
    return moshi.models.loaders


def make_tiny_moshi_folder(folder, loaders, card=2048, dep_q=8):
    """A Moshi weights folder with a tiny random LM and a tiny random Mimi (config files included)."""
    from safetensors.torch import save_file
    lm_cfg = dict(loaders._lm_kwargs)
    lm_cfg.update(dim=32, text_card=64, num_heads=2, num_layers=2, hidden_scale=2.0, context=40, card=card,
                  n_q=2 * dep_q, dep_q=dep_q, delays=[0] + [0, 1] * dep_q, depformer_dim=32,
                  depformer_dim_feedforward=64, depformer_num_heads=2, depformer_num_layers=1)
    mimi_cfg = json.loads(json.dumps(loaders._mimi_config))
    mimi_cfg["seanet"].update(n_filters=4, dimension=32)
    mimi_cfg["transformer"].update(d_model=32, num_heads=2, num_layers=1, dim_feedforward=64,
                                   input_dimension=32, output_dimensions=[32])
    mimi_cfg["quantizer"].update(dimension=16, input_dimension=32, output_dimension=32, n_q=dep_q, bins=card)
    torch.manual_seed(0)
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_cfg, device="cpu", dtype=torch.float32)
    save_file({k: v.contiguous().clone() for k, v in lm.state_dict().items()}, str(folder / "model.safetensors"))
    mimi = loaders.get_mimi(None, mimi_cfg, device="cpu")
    save_file({k: v.contiguous().clone() for k, v in mimi.state_dict().items()},
              str(folder / "tokenizer-e351c8d8-checkpoint125.safetensors"))
    (folder / "mimi_config.json").write_text(json.dumps(mimi_cfg))
    (folder / "config.json").write_text(json.dumps({**lm_cfg, "mimi_config_name": "mimi_config.json"}))
    return folder


def test_moshi_backbone_tiny(tmp_path, monkeypatch):
    loaders = _stub_moshi_deps(monkeypatch)
    folder = make_tiny_moshi_folder(tmp_path, loaders)
    files = validate_folder(folder)
    assert files.tokenizer is None and not files.standard_mimi
    b = make_backbone("moshi", MIMI, size="tiny", device="cpu", checkpoint=str(folder))
    b.start()
    assert not b.info.synthetic
    produced = []
    for k in range(3):
        b.listen(torch.randn(24000) * 0.1, VadResult(True, 0.5, -20.0, -60.0))
        th = b.think(MIMI.frames_in_second(k))
        assert th.decision in (LISTEN, SPEAK)
        assert th.tokens.shape[0] == 8 and th.tokens.shape[1] <= MIMI.frames_in_second(k)
        assert int(th.tokens.min()) >= 0 and int(th.tokens.max()) < 2048
        produced.append(th.tokens.shape[1])
    # Moshi's acoustic delay holds back the first frame(s) once; then every frame comes out
    assert produced[0] < 12 and produced[1:] == [13, 12]
    with pytest.raises(ValueError, match="codebooks"):
        make_backbone("moshi", TokenFormat(4, 2048, 12.5), size="tiny", device="cpu", checkpoint=str(folder)).start()


def test_moshi_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        validate_folder(tmp_path / "nope")
    with pytest.raises(ValueError, match="lacks model.safetensors"):
        validate_folder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="lacks tokenizer-e351c8d8"):
        validate_folder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not readable JSON"):
        validate_folder(tmp_path)
    with pytest.raises(ValueError, match="weights folder"):
        validate_folder(None)


def test_moshi_imported_only_when_chosen():
    code = ("import sys, engine.backbones, engine.session, engine.cli.run; "
            "print(any(m == 'moshi' or m.startswith('moshi.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
