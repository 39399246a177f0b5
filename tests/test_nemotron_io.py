"""The Nemotron codec as a package: checkpoint folders checked by content, the synth command, a live
session and the app's picker through the registry, and its name nowhere else in the product."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.models import registry
from engine.models.nemotron_codec import weights as W
from engine.models.nemotron_codec.checkpoint import VOICECHAT_PREFIX, load, resolve
from engine.models.nemotron_codec.config import TINY
from engine.models.nemotron_codec.tail import build_model, make_tail

ROOT = Path(__file__).resolve().parent.parent
NAME = "nemotron-codec"
YAML = """codec_config:
  latent_size: 32
  n_fft: 16
  hop_length: 4
  base_hidden_size: 16
  channel_mult: [1, 2, 4]
  rates: [2, 3, 3]
  num_blocks: 3
  kernel_size: 7
  groups: 1
  codebook_size: 1024
  num_quantizers: 31
  wav_to_token_ratio: 72
sample_rate: 900
"""


def _codec_folder(tmp_path, seed=4) -> Path:
    d = tmp_path / "codec"
    d.mkdir()
    (d / "codec_config.yaml").write_text(YAML)
    state = W.random_state(TINY, seed)
    state["encoder.layers.0.weight"] = torch.zeros(16, 18, 1)          # encoder keys are ignored
    W.save(state, d / "codec.safetensors")
    return d


def _decode(tail, codes):
    tail.start()
    return np.concatenate([tail.push(codes), tail.flush()])


def test_codec_folder_loads_by_content(tmp_path):
    d = _codec_folder(tmp_path)
    assert registry.resolve_checkpoint(NAME, str(d)) == str(d)
    cfg, state = load(str(d))
    assert cfg == TINY and "encoder.layers.0.weight" not in state
    codes = torch.randint(0, 1024, (31, 30), generator=torch.Generator().manual_seed(1))
    ours = _decode(make_tail(device="cpu", checkpoint=str(d)), codes)
    same = _decode(make_tail(device="cpu", shared={"model": build_model(cfg=TINY, seed=4)}), codes)
    assert np.array_equal(ours, same) and ours.shape == (30 * 72,)


def _voicechat_folder(tmp_path, shards: int = 0) -> Path:
    """A tiny folder in the released VoiceChat layout: NemotronVoiceChat's whole config.json (the codec's
    fields at model.speech_generation.model.codec_config, the rate at data.target_sample_rate) and every
    component in one model.safetensors (or ``shards`` files named by model.safetensors.index.json)."""
    d = tmp_path / "voicechat"
    d.mkdir()
    fields = {"latent_size": 32, "n_fft": 16, "hop_length": 4, "base_hidden_size": 16, "channel_mult": [1, 2, 4],
              "rates": [2, 3, 3], "num_blocks": 3, "kernel_size": 7, "groups": 1, "codebook_size": 1024,
              "num_quantizers": 31, "wav_to_token_ratio": 72}
    config = {"model": {"scoring_asr": "stt_en_fastconformer_transducer_large",
                        "stt": {"model": {"pretrained_llm": "nvidia/NVIDIA-Nemotron-Nano-9B-v2"},
                                "data": {"source_sample_rate": 16000}},
                        "speech_generation": {"model": {"codec_config": fields, "pad_token": "<SPECIAL_12>",
                                                        "tts_config": {"num_quantizers": 31, "codebook_size": 1024}},
                                              "data": {"target_sample_rate": 900, "frame_length": 0.08}}},
              "data": {"frame_length": 0.08, "source_sample_rate": 16000, "target_sample_rate": 900},
              "exp_manager": {"explicit_log_dir": "/tmp"}}
    (d / "config.json").write_text(json.dumps(config))
    state = {VOICECHAT_PREFIX + k: v for k, v in W.random_state(TINY, 4).items()}
    state.update({VOICECHAT_PREFIX + "encoder.layers.0.weight": torch.zeros(16, 18, 1),
                  "tts_model.tts_model.backbone.layers.0.mlp.up_proj.weight": torch.zeros(4, 4),
                  "tts_model.tts_model.rvq_embs": torch.zeros(31, 8, 4),
                  "stt_model.llm.layers.0.mixer.in_proj.weight": torch.zeros(4, 4),
                  "stt_model.perception.encoder.pre_encode.out.weight": torch.zeros(4, 4)})
    if not shards:
        W.save(state, d / "model.safetensors")
        return d
    keys = sorted(state)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {k: names[i % shards] for i, k in enumerate(keys)}
    for name in names:
        W.save({k: state[k] for k in keys if weight_map[k] == name}, d / name)
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0},
                                                                "weight_map": weight_map}))
    return d


@pytest.mark.parametrize("shards", [0, 3], ids=["one file (as released)", "sharded copy"])
def test_voicechat_folder_layout(tmp_path, shards):
    d = _voicechat_folder(tmp_path, shards)
    assert registry.resolve_checkpoint(NAME, str(d)) == str(d)
    cfg, loaded = load(resolve(str(d)))
    assert cfg == TINY and set(loaded) == set(W.decoder_keys(TINY))
    codes = torch.randint(0, 1024, (31, 14), generator=torch.Generator().manual_seed(3))
    ours = _decode(make_tail(device="cpu", checkpoint=str(d)), codes)
    same = _decode(make_tail(device="cpu", shared={"model": build_model(cfg=TINY, seed=4)}), codes)
    assert np.array_equal(ours, same)


@pytest.mark.parametrize("broken", ["flat config", "no codec key", "shard missing", "shard path", "no weight_map"])
def test_broken_voicechat_folders_are_refused_in_one_line(tmp_path, broken):
    d = _voicechat_folder(tmp_path, shards=2 if broken.startswith(("shard", "no weight")) else 0)
    index = d / "model.safetensors.index.json"
    if broken == "flat config":                   # speech_generation at the top, as no release writes it
        doc = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({"speech_generation": doc["model"]["speech_generation"]["model"]}))
        want = "has no model.speech_generation.model.codec_config"
    elif broken == "no codec key":
        state = {VOICECHAT_PREFIX + k: v for k, v in W.random_state(TINY, 4).items() if k != "prvq.mus_list.30"}
        W.save(state, d / "model.safetensors")
        want = "1 key(s) missing or mis-shaped, e.g. tts_model.audio_codec.prvq.mus_list.30"
    elif broken == "shard missing":
        (d / "model-00002-of-00002.safetensors").unlink()
        want = "model-00002-of-00002.safetensors, named by"
    elif broken == "shard path":
        doc = json.loads(index.read_text())
        doc["weight_map"][VOICECHAT_PREFIX + "prvq.mus_list.0"] = "../elsewhere.safetensors"
        index.write_text(json.dumps(doc))
        want = "must be a file name in the folder"
    else:
        index.write_text(json.dumps({"metadata": {}}))
        want = "has no weight_map"
    with pytest.raises(ValueError) as e:
        registry.resolve_checkpoint(NAME, str(d))
    assert want in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("junk", ["yaml", "weights", "keys", "empty"])
def test_junk_folders_are_refused_when_chosen(tmp_path, junk):
    d = _codec_folder(tmp_path)
    if junk == "yaml":
        (d / "codec_config.yaml").write_text("codec_config: [unclosed\n")
    elif junk == "weights":
        (d / "codec.safetensors").write_bytes(b"\x00" * 64)
    elif junk == "keys":
        W.save({"prvq.mus_list.0": torch.zeros(3, 3)}, d / "codec.safetensors")
    else:
        for f in d.iterdir():
            f.unlink()
    with pytest.raises(ValueError) as e:
        registry.resolve_checkpoint(NAME, str(d))
    assert "\n" not in str(e.value) and str(d) in str(e.value)


def test_config_values_are_checked(tmp_path):
    d = _codec_folder(tmp_path)
    (d / "codec_config.yaml").write_text(YAML.replace("wav_to_token_ratio: 72", "wav_to_token_ratio: 70"))
    with pytest.raises(ValueError, match="wav_to_token_ratio 70"):
        resolve(str(d))


def _synth(*args):
    return subprocess.run([sys.executable, "-m", "engine.cli.synth", "--model", NAME, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_synth_command(tmp_path):
    d = _codec_folder(tmp_path)
    codes = np.random.default_rng(2).integers(0, 1024, size=(27, 31))            # frames x num_quantizers
    np.save(tmp_path / "codes.npy", codes)
    p = _synth("--checkpoint", str(d), "--codes", str(tmp_path / "codes.npy"), "--out", str(tmp_path / "o.npy"),
               "--mode", "stock")
    assert p.returncode == 0, p.stderr
    ours = np.load(tmp_path / "o.npy")
    ref = _decode(make_tail(device="cpu", checkpoint=str(d)), torch.from_numpy(codes.T.copy()))
    assert np.array_equal(ours, ref)
    np.save(tmp_path / "bad.npy", codes[:, :30])
    p = _synth("--checkpoint", str(d), "--codes", str(tmp_path / "bad.npy"), "--out", str(tmp_path / "b.npy"))
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "(frames, 31)" in p.stderr
    assert not (tmp_path / "b.npy").exists()


def test_listed_by_the_registry_for_every_front_end():
    entry = registry.get_tail(NAME)
    assert NAME in registry.tail_names() and NAME in registry.benchmarks()
    from app.gui_main import build_parser
    from engine.cli.run import build_parser as run_parser
    assert run_parser().parse_args(["--input", "a", "--output", "b", "--log", "c", "--model", NAME]).model == NAME
    assert build_parser().parse_args(["--model", NAME]).tail == NAME
    assert entry.title and entry.checkpoint_hint


def test_name_appears_nowhere_else_in_the_product():
    allowed = {ROOT / "engine" / "models" / "nemotron_codec"}
    bench = ROOT / "engine" / "bench" / "nemotron_codec.py"                 # the model's benchmark
    hits = []
    for folder in ("engine", "app", "packaging"):
        for f in (ROOT / folder).rglob("*"):
            if f.is_file() and f.suffix in (".py", ".spec", ".sh", ".toml", ".cfg", ".desktop") and \
                    f != bench and not any(a in f.parents for a in allowed):
                text = f.read_text(errors="ignore").lower()
                if "nemotron" in text or "ear_tts" in text:
                    hits.append(str(f.relative_to(ROOT)))
    assert hits == []


def test_live_session_runs_the_codec_tail():
    from engine.session import DuplexSession, SessionConfig
    s = DuplexSession(SessionConfig(tail=NAME, backbone="synthetic", size="tiny", device="cpu", seed=3))
    s.start()
    assert s.fmt.codebooks == 31 and s.fmt.vocab == 1024 and s.tail.info.sample_rate == 900
    t = np.arange(24000) / 24000.0
    outs = [s.process((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))[0] for _ in range(4)]
    s.close()
    assert all(o.shape == (24000,) and np.isfinite(o).all() for o in outs)
    assert s.records[-1].tail == NAME


def test_app_tail_picker_lists_every_registered_tail(qtbot):
    from PySide6.QtCore import Qt
    from app.panels import ModelPanel, short_title
    panel = ModelPanel(cuda=False)
    qtbot.addWidget(panel)
    qtbot.waitUntil(lambda: not panel.checking, timeout=60000)   # its check thread ends before the panel goes
    items = [(panel.tail.itemData(i, Qt.ToolTipRole), panel.tail.itemData(i)) for i in range(panel.tail.count())]
    assert items == [(e.title, e.name) for e in registry.tails()]
    assert (registry.get_tail(NAME).title, NAME) in items
    assert [panel.tail.itemText(i) for i in range(panel.tail.count())] == [short_title(e.title) for e in registry.tails()]
