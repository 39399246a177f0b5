"""The .wav voice-prompt front-end: PCM reading; the features' values (the Slaney filterbanks bit for bit
librosa's as the stock's s3tokenizer stores them; the Whisper log-mel and the 24 kHz prompt mel bit for bit the
stock's own functions; the Kaldi fbank against an independent float64 computation from Kaldi's definition; known
answers for a pure tone); resampling that keeps a tone's frequency and amplitude and removes what the new rate
cannot hold; the ONNX plumbing (with stand-in sessions: the real tokenizer / speaker models ship only with the
checkpoint) and its error messages."""
import importlib.machinery
import importlib.util
import sys
import wave

import numpy as np
import pytest
import torch

import oracles

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


def _s3_dir():
    oracles.require(oracles.S3TOKENIZER)
    spec = importlib.util.find_spec("s3tokenizer")
    return spec.submodule_search_locations[0]


@pytest.fixture(scope="module")
def stock_s3():
    """The stock's ``s3tokenizer/utils.py`` by file path, ``onnx`` / ``torchaudio`` stubbed while it imports
    (its log-mel uses neither)."""
    from stock_step_audio2 import _StubModule
    added = []
    for name in ("onnx", "torchaudio"):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            m = _StubModule(name)
            m.__spec__, m.__path__ = importlib.machinery.ModuleSpec(name, None), []
            sys.modules[name] = m
            added.append(name)
    try:
        spec = importlib.util.spec_from_file_location("_stock_s3tokenizer_utils", f"{_s3_dir()}/utils.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return mod


def test_slaney_filterbanks_are_librosas_bit_for_bit():
    with np.load(f"{_s3_dir()}/assets/mel_filters.npz") as f:   # librosa.filters.mel(sr=16000, n_fft=400, ...)
        for n in (80, 128):
            assert np.array_equal(PA.slaney_mel(16000, 400, n), f[f"mel_{n}"]), n


def test_whisper_log_mel_is_the_stocks_bit_for_bit(stock_s3):
    x16 = (np.random.default_rng(3).standard_normal(37000) * 0.1).astype(np.float32)
    x16[12000:20000] = 0.0                                        # silence: the floors take part
    ours, stock = PA.whisper_log_mel(x16)[0], stock_s3.log_mel_spectrogram(torch.from_numpy(x16))
    assert ours.shape == stock.shape == (128, 231) and torch.equal(ours, stock)


@pytest.mark.oracle
def test_prompt_mel_is_the_stocks_bit_for_bit():
    """The stock's ``mel_spectrogram`` (flashcosyvoice) builds its filterbank with librosa, which is not installed:
    it runs here with ours (the construction checked against librosa's own output above)."""
    oracles.require(oracles.STEPAUDIO2)
    import stock_step_audio2 as S
    A = sys.modules["stepaudio2.flashcosyvoice.utils.audio"]
    keys = ("8000_cpu", "cpu")
    A.mel_basis[keys[0]] = torch.from_numpy(PA.slaney_mel(24000, 1920, 80, 0, 8000))
    A.hann_window[keys[1]] = torch.hann_window(1920)
    try:
        x24 = (np.random.default_rng(4).standard_normal(55000) * 0.1).astype(np.float32)
        x24[20000:30000] = 0.0                                    # silence: the 1e-5 floor takes part
        stock = A.mel_spectrogram(torch.from_numpy(x24)[None]).transpose(1, 2).squeeze(0)
    finally:
        A.mel_basis.pop(keys[0], None)
        A.hann_window.pop(keys[1], None)
    ours = PA.prompt_mel_24k(x24)
    assert ours.shape == stock.shape == (114, 80) and torch.equal(ours, stock)


def test_a_tone_lands_in_its_mel_bins_with_its_energy():
    """1 kHz at amplitude 0.5 is STFT bin 25 (40 Hz bins): a periodic-Hann frame of 400 samples sees power
    (0.5 * 400 / 4)^2 there and a quarter of it in bins 24 and 26, nothing elsewhere. The Whisper log-mel of a
    middle frame is then librosa's filters (as stored by the stock) over those three bins, log10, floored 8
    below the peak, (x + 4) / 4."""
    t = np.arange(16000) / 16000
    ours = PA.whisper_log_mel((0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32))[0, :, 50].double().numpy()
    with np.load(f"{_s3_dir()}/assets/mel_filters.npz") as f:
        w = f["mel_128"].astype(np.float64)
    energy = w[:, 24] * 625.0 + w[:, 25] * 2500.0 + w[:, 26] * 625.0
    log = np.log10(np.maximum(energy, 1e-10))
    want = (np.maximum(log, log.max() - 8.0) + 4.0) / 4.0
    assert int(np.argmax(ours)) == int(np.argmax(want)) == int(np.argmax(w[:, 25]))
    assert np.abs(ours - want).max() < 1e-6                       # float32 STFT leakage: ~1e-7 here


def _kaldi_fbank_float64(x: np.ndarray, n_bins: int = 80, sr: int = 16000) -> np.ndarray:
    """Kaldi's fbank (compute-fbank-feats defaults, dither 0), written from its definition in float64: 25 ms
    frames every 10 ms (snip edges), DC removed, pre-emphasis 0.97 (the first sample against itself), Povey
    window, zero-padded to 512, power spectrum, triangles on 1127 ln(1 + f/700) from 20 Hz to Nyquist over
    the first 256 bins, natural log floored at float32 eps."""
    frame, shift, n_fft = 400, 160, 512
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)                             # noqa: E731
    edges = mel(20.0) + np.arange(n_bins + 2) * (mel(sr / 2) - mel(20.0)) / (n_bins + 1)
    bank = np.zeros((n_bins, n_fft // 2))
    for b in range(n_bins):
        left, centre, right = edges[b:b + 3]
        for k in range(n_fft // 2):
            m = mel(k * sr / n_fft)
            if left < m <= centre:
                bank[b, k] = (m - left) / (centre - left)
            elif centre < m < right:
                bank[b, k] = (right - m) / (right - centre)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(frame) / (frame - 1))) ** 0.85
    out = []
    for i in range(1 + (x.size - frame) // shift):
        f = x[i * shift:i * shift + frame].astype(np.float64)
        f = f - f.mean()
        f = np.concatenate([[f[0] - 0.97 * f[0]], f[1:] - 0.97 * f[:-1]]) * window
        power = np.abs(np.fft.rfft(f, n_fft)) ** 2
        out.append(np.log(np.maximum(bank @ power[:n_fft // 2], np.finfo(np.float32).eps)))
    return np.array(out)


def test_kaldi_fbank_values_match_kaldis_definition():
    x16 = (np.random.default_rng(5).standard_normal(8000) * 0.1).astype(np.float32)
    ours, want = PA.kaldi_fbank(x16).double().numpy(), _kaldi_fbank_float64(x16)
    assert ours.shape == want.shape == (48, 80)
    assert np.abs(ours - want).max() < 3e-4      # float32 vs float64 (7.5e-5 here, in the narrowest low bins)
    t = np.arange(8000) / 16000                                   # a 1 kHz tone peaks in the bin centred nearest it
    tone = PA.kaldi_fbank((0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)).numpy()
    centres = 700.0 * (np.exp((1127.0 * np.log(1 + 20 / 700) + np.arange(1, 81) * (
        1127.0 * np.log(1 + 8000 / 700) - 1127.0 * np.log(1 + 20 / 700)) / 81) / 1127.0) - 1)
    assert (np.argmax(tone, axis=1) == np.argmin(np.abs(centres - 1000.0))).all()


@pytest.mark.parametrize("to", [16000, 24000])
def test_resampling_keeps_a_tones_frequency_and_amplitude_and_drops_what_cannot_fit(to):
    """441 Hz at 0.5 and 9 kHz at 0.3, from 22.05 kHz: both kept at 24 kHz; at 16 kHz the 9 kHz tone is past
    Nyquist and must be gone (not folded back to 7 kHz)."""
    sr = 22050
    t = np.arange(2 * sr) / sr
    x = (0.5 * np.sin(2 * np.pi * 441 * t) + 0.3 * np.sin(2 * np.pi * 9000 * t)).astype(np.float32)
    y = PA.resample(x, sr, to)
    assert y.dtype == np.float32 and abs(y.size - 2 * to) <= 1
    spec = np.abs(np.fft.rfft(y[to // 2:to // 2 + to].astype(np.float64))) * 2 / to      # 1 s: 1 Hz bins
    assert int(np.argmax(spec)) == 441 and abs(spec[441] - 0.5) < 0.005
    if to == 24000:
        assert abs(spec[9000] - 0.3) < 0.005
    else:
        assert np.sort(spec)[-2] < 0.003                            # nothing but the 441 Hz tone


class _FakeSession:
    feeds: dict = {}                                        # what each model was handed, by kind

    def __init__(self, kind):
        self.kind = kind

    def get_inputs(self):
        return [type("I", (), {"name": n})() for n in ("feats", "feats_length")]

    def run(self, _, feeds):
        _FakeSession.feeds[self.kind] = feeds
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
    x, sr = PA.read_wav(tmp_path / "p.wav")                 # the models and the prompt got the front end's values
    x16, x24 = PA.resample(x, sr, 16000), PA.resample(x, sr, 24000)
    tok, spk = _FakeSession.feeds["tok"], _FakeSession.feeds["spk"]
    assert np.array_equal(tok["feats"], PA.whisper_log_mel(x16).numpy()) and tok["feats_length"].tolist() == [130]
    fb = PA.kaldi_fbank(x16)
    assert np.array_equal(spk["feats"], (fb - fb.mean(dim=0, keepdim=True)).unsqueeze(0).numpy())
    assert torch.equal(p.mel[0], PA.prompt_mel_24k(x24)[:64])
    assert torch.equal(p.spk[0], torch.from_numpy(np.linspace(-1, 1, 192, dtype=np.float32))) and p.tokens[0].tolist() == list(range(32))


def test_wav_prompt_names_the_missing_model(tmp_path):
    _tone(tmp_path / "p.wav")
    with pytest.raises(FileNotFoundError, match="speech_tokenizer_v2_25hz.onnx"):
        load_prompt(str(tmp_path / "p.wav"), str(tmp_path))
    with pytest.raises(ValueError, match="--checkpoint"):
        load_prompt(str(tmp_path / "p.wav"), None)
