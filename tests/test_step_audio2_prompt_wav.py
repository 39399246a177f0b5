"""The .wav voice-prompt front-end: PCM reading, feature shapes and rates, the ONNX plumbing (with stand-in
sessions: the real tokenizer / speaker models ship only with the checkpoint) and its error messages."""
import wave

import numpy as np
import pytest
import torch

from engine.models.step_audio2 import prompt_audio as PA
from engine.models.step_audio2.prompt import load_prompt


def _tone(path, seconds=1.3, sr=22050, width=2):
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.RandomState(0).randn(t.size)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(width)
        w.setframerate(sr)
        pcm = (np.clip(x, -1, 1) * 32767).astype("<i2")
        w.writeframes(np.repeat(pcm[:, None], 2, axis=1).tobytes())
    return x


def test_wav_reading_downmixes_and_scales(tmp_path):
    x = _tone(tmp_path / "a.wav")
    y, sr = PA.read_wav(tmp_path / "a.wav")
    assert sr == 22050 and y.dtype == np.float32 and y.shape == x.shape
    assert np.abs(y - x).max() < 1e-3


def test_features_have_the_stock_rates():
    x16 = np.random.RandomState(1).randn(16000).astype(np.float32) * 0.1
    x24 = np.random.RandomState(2).randn(24000).astype(np.float32) * 0.1
    assert PA.whisper_log_mel(x16).shape == (1, 128, 100)          # 100 frames a second
    fb = PA.kaldi_fbank(x16)
    assert fb.shape == (98, 80) and torch.isfinite(fb).all()       # snip-edges 25 ms / 10 ms frames
    assert PA.prompt_mel_24k(x24).shape == (50, 80)                # 50 Hz, as the flow's mel
    w = PA.slaney_mel(24000, 1920, 80, 0, 8000)
    assert w.shape == (80, 961) and (w.sum(1) > 0).all() and w[:, 641:].max() == 0   # nothing above 8 kHz (bin 640)


class _FakeSession:
    def __init__(self, kind):
        self.kind = kind

    def get_inputs(self):
        return [type("I", (), {"name": n})() for n in ("feats", "feats_length")]

    def run(self, _, feeds):
        if self.kind == "tok":
            frames = int(feeds["feats_length"][0])
            return [np.arange(frames // 4, dtype=np.int64)[None] % 6561]
        assert feeds["feats"].shape[2] == 80
        return [np.linspace(-1, 1, 192, dtype=np.float32)[None]]


def test_wav_prompt_runs_both_onnx_models_and_matches_two_frames_a_token(tmp_path, monkeypatch):
    _tone(tmp_path / "p.wav")
    for name in (PA.TOKENIZER, PA.SPEAKER):
        (tmp_path / name).write_bytes(b"onnx")
    monkeypatch.setattr(PA, "_session", lambda p: _FakeSession("tok" if p.name == PA.TOKENIZER else "spk"))
    p = load_prompt(str(tmp_path / "p.wav"), str(tmp_path))
    assert p.tokens.shape == (1, 32) and p.mel.shape == (1, 64, 80) and p.spk.shape == (1, 192)


def test_wav_prompt_names_the_missing_model(tmp_path):
    _tone(tmp_path / "p.wav")
    with pytest.raises(FileNotFoundError, match="speech_tokenizer_v2_25hz.onnx"):
        load_prompt(str(tmp_path / "p.wav"), str(tmp_path))
    with pytest.raises(ValueError, match="--checkpoint"):
        load_prompt(str(tmp_path / "p.wav"), None)
