"""The voice of a MiniCPM-o 4.5 session: a released-layout folder's ``assets/HT_ref_audio.wav`` becomes the
token2wav prompt through the folder's ``assets/token2wav/`` ONNX models; ``--voice`` overrides it; without
a folder the synthetic prompt, labelled. The ONNX models ship only with the checkpoint, so the wiring runs
with stand-in sessions (the real front-end around them); the error paths run for real: no onnxruntime, a
broken / short / missing WAV, a model that fails, a voice for a tail without one — one line each."""
from __future__ import annotations

import shutil
import sys
import types
import wave

import numpy as np
import pytest
import torch

from engine.backbones.minicpmo45 import DEFAULT_VOICE
from engine.models.step_audio2.voice import ONNX_FILES, Voice, load_voice
from engine.models.step_audio2 import prompt_audio as PA
from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.config import preset as t2w_preset
from engine.models.step_audio2.prompt import synthetic_prompt
from engine.session.config import SessionConfig
from engine.session.session import DuplexSession

from test_minicpmo45_weights import folder  # noqa: F401  (the tiny released-layout folder fixture)
from test_step_audio2_io import _write_checkpoint


def _tone(path, seconds=1.3, sr=22050, hz=220.0):
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * hz * t) + 0.05 * np.random.RandomState(int(hz)).randn(t.size)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return path


class _Stand_in:
    """An onnxruntime session's interface with a deterministic answer (tokens from the feature frames)."""

    def __init__(self, path):
        self.kind = "tok" if path.name == PA.TOKENIZER else "spk"

    def get_inputs(self):
        return [types.SimpleNamespace(name=n) for n in ("feats", "feats_length")]

    def run(self, _, feeds):
        if self.kind == "tok":
            mel = feeds["feats"]                                # (1, 128, frames)
            n = int(feeds["feats_length"][0]) // 4
            return [(np.abs(mel[0, :, : 4 * n]).reshape(128, n, 4).sum(axis=(0, 2)) * 97).astype(np.int64)[None]
                    % 6561]
        fb = feeds["feats"][0]                                  # (frames, 80) Kaldi fbank
        return [np.resize(fb.std(axis=0), 192)[None].astype(np.float32)]


@pytest.fixture
def onnx_stand_in(monkeypatch):
    """onnxruntime importable, and the two models answered by stand-ins."""
    monkeypatch.setitem(sys.modules, "onnxruntime", types.ModuleType("onnxruntime"))
    monkeypatch.setattr(PA, "_session", _Stand_in)


@pytest.fixture(scope="module")
def released(folder, tmp_path_factory):  # noqa: F811
    """The tiny folder with assets/: token2wav (tiny Step-Audio2 weights + the two ONNX files) and the voice."""
    p = tmp_path_factory.mktemp("released") / "MiniCPM-o-4_5"
    shutil.copytree(folder, p)
    t2w = p / "assets" / "token2wav"
    t2w.mkdir(parents=True)
    _write_checkpoint(t2w, W.random_state_dict(t2w_preset("tiny"), seed=2))
    for name in ONNX_FILES:
        (t2w / name).write_bytes(b"stand-in")
    _tone(p / DEFAULT_VOICE)
    return p


def _cfg(path, **kw):
    return SessionConfig(backbone="minicpm-o-4.5", backbone_checkpoint=str(path), device="cpu", size="tiny",
                         cpu_threads=1, **kw)


def _same_prompt(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in ((a.tokens, b.tokens), (a.mel, b.mel), (a.spk, b.spk)))


def test_the_folders_default_voice_is_the_prompt(released, onnx_stand_in, one_torch_thread):
    c = _cfg(released).resolved()
    assert c.voice == str(released / DEFAULT_VOICE) and c.checkpoint == str(released / "assets" / "token2wav")
    s = DuplexSession(c)
    s.start()
    want = PA.prompt_from_wav(released / DEFAULT_VOICE, released / "assets" / "token2wav")
    assert _same_prompt(s.tail.prompt, want) and want.tokens.shape[1] == 32     # 1.3 s: 32 tokens
    x, sr = PA.read_wav(released / DEFAULT_VOICE)          # the front end's values reach the prompt, not only shapes
    assert torch.equal(s.tail.prompt.mel[0], PA.prompt_mel_24k(PA.resample(x, sr, 24000))[:64])
    fb = PA.kaldi_fbank(PA.resample(x, sr, 16000))
    fb = (fb - fb.mean(dim=0, keepdim=True)).numpy()        # the stand-in speaker model: each bin's spread
    assert torch.equal(s.tail.prompt.spk[0], torch.from_numpy(np.resize(fb.std(axis=0), 192).astype(np.float32)))
    assert s.info["voice"] == "HT_ref_audio.wav (checkpoint default)" and not s.info["synthetic"]
    assert s.backbone.reference_clip == released / DEFAULT_VOICE               # the LLM's reference clip too
    out, rec = s.process(np.zeros(24000, np.float32))       # the session runs (the model's own turns)
    assert out.shape == (24000,) and (rec.decision == "listen") == (not np.any(out))
    s.close()


def test_a_named_voice_overrides_the_default(released, onnx_stand_in, tmp_path, one_torch_thread):
    mine = _tone(tmp_path / "mine.wav", seconds=2.0, sr=16000, hz=330.0)
    s = DuplexSession(_cfg(released, voice=str(mine)))
    s.start()
    want = PA.prompt_from_wav(mine, released / "assets" / "token2wav")
    assert _same_prompt(s.tail.prompt, want) and want.tokens.shape[1] == 50
    default = PA.prompt_from_wav(released / DEFAULT_VOICE, released / "assets" / "token2wav")
    assert not torch.equal(s.tail.prompt.spk, default.spk)
    assert s.info["voice"] == "mine.wav (--voice)"
    b = s.backbone                                          # the LLM's prelude takes the same clip
    assert b.reference_clip == mine
    from engine.backbones.minicpmo45.prompt import prelude
    from engine.backbones.minicpmo45.ref_audio import reference_embeddings
    with torch.no_grad():
        pre = prelude(b.folder.tokenizer, b.system_prompt, reference_embeddings(b.encoder, mine))
    assert pre.reference.shape[0] == 20 and b.kv_llm.length == len(pre.prefix_ids) + 20 + len(pre.suffix_ids)
    s.close()


def test_without_a_checkpoint_the_synthetic_prompt_is_labelled(one_torch_thread):
    s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", device="cpu", size="tiny", seed=5, cpu_threads=1))
    s.start()
    assert _same_prompt(s.tail.prompt, synthetic_prompt(6.0, 5))
    assert s.info["voice"].startswith("synthetic voice prompt")
    s.close()


def test_a_folder_without_the_voice_file_falls_back_to_the_synthetic_prompt(released, tmp_path):
    p = tmp_path / "no-voice"
    shutil.copytree(released, p)
    (p / DEFAULT_VOICE).unlink()
    assert _cfg(p).resolved().voice is None


def _cli(tmp_path, *args):
    from engine.audio import write_wav
    from engine.cli.run import main
    wav = write_wav(tmp_path / "in.wav", np.zeros(24000, dtype=np.float32), 24000)
    rc = main(["--backbone", "minicpm-o-4.5", "--size", "tiny", "--device", "cpu", "--input", str(wav),
               "--output", str(tmp_path / "out.wav"), "--log", str(tmp_path / "log"), *args])
    return rc


def _one_line(capsys, *needles):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_without_onnxruntime_one_line_names_the_file(released, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)             # import onnxruntime -> ImportError
    rc = _cli(tmp_path, "--backbone-checkpoint", str(released))
    _one_line(capsys, str(released / DEFAULT_VOICE), "onnxruntime", "duplexcadence[onnx]")
    assert rc == 2 and not (tmp_path / "out.wav").exists() and not (tmp_path / "log").exists()


@pytest.mark.parametrize("case", ["garbage", "short", "missing", "folder"])
def test_a_broken_voice_file_gives_one_line(released, onnx_stand_in, tmp_path, capsys, case):
    v = tmp_path / "v.wav"
    if case == "garbage":
        v.write_bytes(b"RIFF\x00\x00\x00\x00not a wave file at all")
    elif case == "short":
        _tone(v, seconds=0.2)
    elif case == "folder":
        v.mkdir()
    rc = _cli(tmp_path, "--backbone-checkpoint", str(released), "--voice", str(v))
    expect = {"garbage": "voice file", "short": "0.20 s", "missing": "does not exist", "folder": "not a regular"}
    _one_line(capsys, str(v), expect[case])
    assert rc == 2 and not (tmp_path / "out.wav").exists()


def test_a_wav_voice_needs_the_onnx_models(tmp_path, capsys, onnx_stand_in):
    v = _tone(tmp_path / "v.wav")
    rc = _cli(tmp_path, "--voice", str(v))                             # no checkpoint: no ONNX models
    _one_line(capsys, str(v), "speech_tokenizer_v2_25hz.onnx")
    assert rc == 2
    with pytest.raises(ValueError, match="voice prompt is for the step-audio2 tail"):
        SessionConfig(tail="mimi", voice=str(v), device="cpu").resolved()


def test_a_failing_onnx_model_is_named(released, monkeypatch, tmp_path, capsys):
    class Broken(RuntimeError):
        pass

    def session(path):
        raise Broken(f"[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from {path} failed")
    monkeypatch.setitem(sys.modules, "onnxruntime", types.ModuleType("onnxruntime"))
    monkeypatch.setattr(PA, "_session", session)
    with pytest.raises(ValueError, match="could not be turned into a voice prompt.*INVALID_PROTOBUF"):
        load_voice(Voice(str(released / DEFAULT_VOICE), "checkpoint default"), str(released / "assets/token2wav"))
    rc = _cli(tmp_path, "--backbone-checkpoint", str(released))
    _one_line(capsys, str(released / DEFAULT_VOICE), "INVALID_PROTOBUF")
    assert rc != 0 and not (tmp_path / "out.wav").exists()


def test_the_model_panel_names_the_voice_and_remembers_it(qtbot, tmp_path):
    """The app's Model panel: a Voice file row (step-audio2 only) whose file reaches the session config, the
    engine's verdict on it (one line naming the file) and the settings."""
    from app.settings import load_settings, open_qsettings
    from engine.session import LiveRunner
    from test_app_fakes import make_window
    w = make_window(qtbot, tmp_path, LiveRunner)
    panel = w.model_panel
    bad = tmp_path / "short.wav"
    _tone(bad, seconds=0.2)
    panel.set_values("step-audio2", "synthetic", "tiny", "", "", str(bad))
    qtbot.waitUntil(lambda: not panel.checking, timeout=10000)
    assert panel.voice.isEnabled() and panel.config().voice == str(bad)
    assert panel.status.text().startswith("✗ voice file") and str(bad) in panel.status.text()
    npz = tmp_path / "v.npz"
    p = synthetic_prompt(1.0, 0)
    np.savez(npz, prompt_tokens=p.tokens[0].numpy(), prompt_mel=p.mel[0].numpy(),
             speaker_embedding=p.spk[0].numpy())
    panel.set_values("step-audio2", "synthetic", "tiny", "", "", str(npz))
    qtbot.waitUntil(lambda: not panel.checking, timeout=10000)
    assert panel.status.text().startswith("✓") and "voice: v.npz" in panel.status.text()
    w.save_settings()
    assert load_settings(open_qsettings(str(tmp_path / "s.ini"))).voice == str(npz)
    panel.set_values("mimi", "synthetic", "tiny", "", "", "")
    assert not panel.voice.isEnabled()
