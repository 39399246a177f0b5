"""The MiniCPM-o 4.5 checkpoint loader on a tiny synthetic folder in the released layout (config.json
with nested audio/tts configs, a two-shard safetensors index, tokenizer.json built with the
``tokenizers`` library, added_tokens.json) and on broken variants: one clear error naming the file or key."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import oracles

from engine.backbones.minicpmo45.audio import AudioEncoder
from engine.backbones.minicpmo45.dims import TOKEN_NAMES, preset
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.tts import TTS
from engine.backbones.minicpmo45.weights import open_folder
from minicpmo45_stock_folder import write_shards

oracles.require_module(oracles.TOKENIZERS)
import tokenizers  # noqa: E402

D = preset("tiny")


def _config() -> dict:
    a, l, t = D.audio, D.llm, D.tts
    return {
        "architectures": ["MiniCPMO"], "model_type": "minicpmo", "hidden_size": l.hidden,
        "num_hidden_layers": l.layers, "num_attention_heads": l.heads, "num_key_value_heads": l.kv_heads,
        "head_dim": l.head_dim, "intermediate_size": l.ffn, "vocab_size": l.vocab, "rope_theta": l.rope_theta,
        "rms_norm_eps": l.eps, "max_position_embeddings": l.max_positions, "tie_word_embeddings": False,
        "audio_pool_step": a.pool,
        "audio_config": {"model_type": "whisper", "d_model": a.d_model, "encoder_layers": a.layers,
                         "encoder_attention_heads": a.heads, "encoder_ffn_dim": a.ffn, "num_mel_bins": a.n_mels,
                         "max_source_positions": a.max_positions},
        "tts_config": {"backbone_model": "llama", "hidden_size": t.hidden, "num_hidden_layers": t.layers,
                       "num_attention_heads": t.heads, "num_key_value_heads": t.kv_heads,
                       "intermediate_size": t.ffn, "num_text_tokens": t.text_vocab, "num_audio_tokens": t.codes,
                       "num_vq": 1, "audio_bos_token_id": t.audio_bos, "llm_dim": l.hidden},
        "vision_config": {"hidden_size": 8},
    }


def _tokenizer(path: Path) -> dict:
    """A word-level tokenizer: ordinary words below, the protocol's tokens at the top of the vocabulary."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    specials = {name: getattr(D.tokens, field) for field, name in TOKEN_NAMES.items()}
    vocab = {f"w{i}": i for i in range(min(specials.values()))}
    vocab.update(specials)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(n, special=True) for n in specials])
    tok.save(str(path / "tokenizer.json"))
    return specials


def _weights(seed: int = 11) -> dict:
    """Our modules' seeded weights under the released key names (plus keys the loader must skip)."""
    llm, tts, enc = Qwen3(D.llm), TTS(D.tts, D.llm), AudioEncoder(D.audio, D.llm.hidden)
    for i, m in enumerate((llm, tts, enc)):
        seeded_init(m, seed + i, std=0.05)
    out = {f"llm.{k}": v for k, v in llm.state_dict().items()}
    for k, v in tts.state_dict().items():
        if k == "head_code.0.weight":
            g = v.norm(dim=1, keepdim=True) * 1.5
            out["tts.head_code.0.parametrizations.weight.original0"] = g
            out["tts.head_code.0.parametrizations.weight.original1"] = v
        else:
            out[f"tts.{k}"] = v
    for k, v in enc.state_dict().items():
        out[("audio_projection_layer." + k[5:]) if k.startswith("proj.") else f"apm.{k}"] = v
    out["vpm.patch_embed.weight"] = torch.randn(4, 4)
    out["resampler.query"] = torch.randn(2, 4)
    out["tts.projector_spk.linear1.weight"] = torch.randn(4, 4)
    out["tts.model.embed_tokens.weight"] = torch.randn(4, 4)
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("MiniCPM-o-4_5")
    (p / "config.json").write_text(json.dumps(_config(), indent=2))
    specials = _tokenizer(p)
    (p / "added_tokens.json").write_text(json.dumps(specials))
    write_shards(p, _weights())
    return p


def _copy(folder: Path, tmp: Path) -> Path:
    dst = tmp / "ckpt"
    shutil.copytree(folder, dst)
    return dst


def _backbone(path, seed=0):
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", seed=seed,
                           checkpoint=str(path), turn_policy="voice-activity")
    b.start()
    return b


def test_loads_every_module_from_the_released_layout(folder, one_torch_thread):
    f = open_folder(folder)
    assert f.dims == D and f.tokenizer.decode([1, 2]) == "w1 w2"
    b = _backbone(folder)
    w = _weights()
    assert torch.equal(b.llm.model.layers[1].self_attn.k_norm.weight, w["llm.model.layers.1.self_attn.k_norm.weight"])
    assert torch.equal(b.llm.lm_head.weight, w["llm.lm_head.weight"])
    assert torch.equal(b.encoder.layers[0].self_attn.q_proj.bias, w["apm.layers.0.self_attn.q_proj.bias"])
    assert torch.equal(b.encoder.proj.linear2.weight, w["audio_projection_layer.linear2.weight"])
    assert torch.equal(b.tts.projector_semantic.linear1.weight, w["tts.projector_semantic.linear1.weight"])
    v = w["tts.head_code.0.parametrizations.weight.original1"]
    g = w["tts.head_code.0.parametrizations.weight.original0"]
    stock_head = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(v.shape[1], v.shape[0], bias=False))
    stock_head.parametrizations.weight.original0.data.copy_(g)        # the stock's head: weight recomputed from g, v
    stock_head.parametrizations.weight.original1.data.copy_(v)
    assert torch.equal(b.tts.head_code[0].weight, stock_head.weight)
    assert not torch.equal(b.tts.head_code[0].weight, v)
    assert "checkpoint" in b.info.title and not b.info.synthetic
    # a second with real (tiny) weights and the tokenizer: the text is the tokenizer's words
    from engine.vad import VadResult
    x = torch.from_numpy((np.random.default_rng(0).standard_normal(24000) * 0.1).astype(np.float32))
    for speech in (True, False):
        b.listen(x, VadResult(speech, 1.0, 0.0, -70.0))
        t = b.think(25)
    assert t.decision == "speak" and t.tokens is not None and all(w.startswith("w") for w in t.text.split())


def test_session_config_takes_the_folder(folder):
    from engine.session.config import SessionConfig
    c = SessionConfig(backbone="minicpm-o-4.5", backbone_checkpoint=str(folder), device="cpu").resolved()
    assert c.backbone_checkpoint == str(folder) and c.size == "tiny"
    with pytest.raises(ValueError, match="step-audio2"):
        SessionConfig(backbone="minicpm-o-4.5", tail="mimi", device="cpu").resolved()


def _index(p: Path) -> dict:
    return json.loads((p / "model.safetensors.index.json").read_text())


BROKEN = {
    "missing shard": (lambda p: (p / "model-00002-of-00002.safetensors").unlink(),
                      "lacks shard model-00002-of-00002.safetensors"),
    "missing index": (lambda p: (p / "model.safetensors.index.json").unlink(), "lacks model.safetensors.index.json"),
    "bad config json": (lambda p: (p / "config.json").write_text("{not json"), "config.json is not valid JSON"),
    "config lacks a field": (lambda p: (p / "config.json").write_text(
        json.dumps({k: v for k, v in _config().items() if k != "intermediate_size"})), "lacks 'intermediate_size'"),
    "config wrong type": (lambda p: (p / "config.json").write_text(
        json.dumps(dict(_config(), audio_config=3))), "wrong type"),
    "no tokenizer": (lambda p: (p / "tokenizer.json").unlink(), "lacks tokenizer.json"),
    "tokenizer lacks a protocol token": (lambda p: _drop_token(p, "<|turn_eos|>"), "no token <|turn_eos|>"),
    "not a folder": (lambda p: shutil.rmtree(p), "does not exist"),
    "bad_token_ids not ids": (lambda p: (p / "tokenizer_config.json").write_text(
        json.dumps({"bad_token_ids": ["w1"]})), "tokenizer_config.json: bad_token_ids must be a list of token ids"),
    "bad_token_ids outside the vocabulary": (lambda p: (p / "tokenizer_config.json").write_text(
        json.dumps({"bad_token_ids": [3, 10 ** 9]})), "bad_token_ids holds 1000000000, outside"),
}


def test_the_tokenizers_bad_token_ids_are_never_drawn(folder, tmp_path, one_torch_thread):
    """tokenizer_config.json's bad_token_ids (as the released tokenizer lists them) join <|tts_pad|> and
    <|chunk_eos|> in the LLM's forbidden list (the stock's StreamDecoder list): the second draw never gives
    them, even when they dominate."""
    p = _copy(folder, tmp_path)
    (p / "tokenizer_config.json").write_text(json.dumps({"bad_token_ids": [7, 3, 7], "model_max_length": 10}))
    f = open_folder(p)
    assert f.bad_token_ids == (3, 7) and open_folder(folder).bad_token_ids == ()
    b = _backbone(p)
    sampler = b.protocol.sampler
    tk = D.tokens
    assert sampler.forbidden == sorted({3, 7, tk.tts_pad, tk.chunk_eos})
    logits = torch.full((1, D.llm.vocab), -20.0)
    logits[0, [3, 7, tk.tts_pad]] = 20.0                              # forbidden ones dominate ...
    logits[0, [11, 12]] = 19.0                                        # ... then these
    torch.manual_seed(1)
    picks = [sampler(logits) for _ in range(60)]
    assert set(picks) <= {11, 12}
    assert set(sampler.history) <= {11, 12} and sampler.history


def _drop_token(p: Path, name: str) -> None:
    added = json.loads((p / "added_tokens.json").read_text())
    (p / "added_tokens.json").write_text(json.dumps({k: v for k, v in added.items() if k != name}))
    data = json.loads((p / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != name]
    data["model"]["vocab"].pop(name)
    (p / "tokenizer.json").write_text(json.dumps(data))


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_folders_give_one_clear_error(folder, tmp_path, case):
    p = _copy(folder, tmp_path)
    breaker, message = BROKEN[case]
    breaker(p)
    with pytest.raises(ValueError, match=message.replace("|", r"\|")):
        open_folder(p)


def _rewrite_shard(p: Path, fn) -> None:
    from safetensors.torch import load_file
    name = "model-00001-of-00002.safetensors"
    t = load_file(str(p / name))
    fn(t)
    save_file(t, str(p / name))


def test_missing_key_and_wrong_shape_name_the_key(folder, tmp_path, one_torch_thread):
    p = _copy(folder, tmp_path)
    idx = _index(p)
    key = sorted(k for k in idx["weight_map"] if k.startswith("llm.model.layers.1."))[0]
    del idx["weight_map"][key]
    (p / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(ValueError, match=f"no key '{key}'"):
        _backbone(p)
    p2 = tmp_path / "shape"
    shutil.copytree(folder, p2)
    victim = sorted(k for k, s in _index(p2)["weight_map"].items() if s.startswith("model-00001") and "weight" in k
                    and not k.startswith(("vpm", "resampler", "tts.projector_spk", "tts.model.embed")))[0]
    _rewrite_shard(p2, lambda t: t.__setitem__(victim, torch.zeros(3, 5)))
    with pytest.raises(ValueError, match=f"checkpoint key '{victim}' has shape \\(3, 5\\)"):
        _backbone(p2)
    p3 = tmp_path / "lost"
    shutil.copytree(folder, p3)
    _rewrite_shard(p3, lambda t: t.pop(victim))
    with pytest.raises(ValueError, match=f"lacks key '{victim}'"):
        _backbone(p3)


def test_cli_names_a_broken_folder_in_one_line(folder, tmp_path, capsys):
    from engine.audio import write_wav
    from engine.cli.run import main
    p = _copy(folder, tmp_path)
    (p / "model-00002-of-00002.safetensors").unlink()
    wav = write_wav(tmp_path / "in.wav", np.zeros(24000, dtype=np.float32), 24000)
    rc = main(["--backbone", "minicpm-o-4.5", "--size", "tiny", "--device", "cpu", "--backbone-checkpoint", str(p),
               "--input", str(wav), "--output", str(tmp_path / "out.wav"), "--log", str(tmp_path / "log")])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "lacks shard model-00002-of-00002.safetensors" in err
    assert not (tmp_path / "out.wav").exists()


# -- the Hugging Face hub cache layout -----------------------------------------------------------------------

def hub_snapshot(folder: Path, cache: Path, rev: str = "0123abcd") -> Path:
    """``folder`` as a hub download leaves it: every file a link ``snapshots/REV/NAME -> ../../blobs/HASH``."""
    import hashlib
    blobs, snap = cache / "blobs", cache / "snapshots" / rev
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(folder.rglob("*")):
        rel = f.relative_to(folder)
        if f.is_dir():
            (snap / rel).mkdir(parents=True, exist_ok=True)
            continue
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blobs / digest)
        (snap / rel).symlink_to(Path(*[".."] * (len(rel.parts) + 1), "blobs", digest))
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text(rev)
    return snap


def test_a_hub_snapshot_whose_files_link_into_its_blobs_is_read(folder, tmp_path, one_torch_thread):
    snap = hub_snapshot(folder, tmp_path / "models--openbmb--MiniCPM-o-4_5")
    shard = snap / "model-00001-of-00002.safetensors"
    assert shard.is_symlink() and not os.path.realpath(shard).startswith(str(snap))
    f = open_folder(snap)
    assert f.dims == D and set(f.weight_map.values()) == set(open_folder(folder).weight_map.values())
    from engine.session.config import SessionConfig
    c = SessionConfig(backbone="minicpm-o-4.5", backbone_checkpoint=str(snap), device="cpu").resolved()
    assert c.backbone_checkpoint == str(snap)
    b = _backbone(snap)
    assert torch.equal(b.llm.lm_head.weight, _weights()["llm.lm_head.weight"])


def _relink(target_of) -> callable:
    def edit(snap: Path) -> None:
        shard = snap / "model-00001-of-00002.safetensors"
        shard.unlink()
        shard.symlink_to(target_of(snap))
    return edit


def _fifo(snap: Path) -> Path:
    os.mkfifo(snap.parent / "fifo")
    return snap.parent / "fifo"


def _subfolder_name(snap: Path) -> None:
    idx = json.loads((snap / "model.safetensors.index.json").read_text())
    (snap / "sub").mkdir()
    os.rename(snap / "model-00001-of-00002.safetensors", snap / "sub" / "model-00001-of-00002.safetensors")
    idx["weight_map"] = {k: ("sub/" + v if v.startswith("model-00001") else v) for k, v in idx["weight_map"].items()}
    (snap / "model.safetensors.index.json").unlink()
    (snap / "model.safetensors.index.json").write_text(json.dumps(idx))


@pytest.mark.parametrize("case,edit,words", [
    ("a link to a FIFO", _relink(_fifo), "which is a link to a FIFO; a shard must be a regular file"),
    ("a link to a device", _relink(lambda s: Path("/dev/zero")), "which is a link to a device"),
    ("a link to a folder", _relink(lambda s: s.parent), "which is a link to a folder"),
    ("a name with a folder part", _subfolder_name, "not a plain file name"),
])
def test_a_hub_snapshot_refuses_a_shard_that_is_not_a_regular_file(folder, tmp_path, case, edit, words):
    snap = hub_snapshot(folder, tmp_path / "models--openbmb--MiniCPM-o-4_5")
    edit(snap)
    with pytest.raises(ValueError) as e:
        open_folder(snap)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
