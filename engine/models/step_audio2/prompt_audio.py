"""A voice prompt from a .wav, as the stock ``Token2wav._prepare_prompt`` makes it.

* speech tokens: 16 kHz audio -> Whisper log-mel (128 bins) -> ``speech_tokenizer_v2_25hz.onnx``;
* speaker x-vector: 16 kHz audio -> Kaldi fbank (80 bins, no dither, mean-normalised) -> ``campplus.onnx``;
* prompt mel: 24 kHz audio -> 80-bin log-mel (n_fft 1920, hop 480, 0-8 kHz, reflect-padded, not centred).

Both ONNX models come from the checkpoint folder and run on the CPU with onnxruntime (the ``onnx`` extra).
Mel filterbanks are the Slaney-style ones librosa builds; the Kaldi filterbank is Kaldi's own.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from engine.wavio import read_wav

from .stream import Prompt

TOKENIZER = "speech_tokenizer_v2_25hz.onnx"
SPEAKER = "campplus.onnx"


def resample(x: np.ndarray, sr: int, to: int) -> np.ndarray:
    if sr == to:
        return x
    import soxr
    return soxr.resample(x, sr, to).astype(np.float32)


# -- filterbanks -----------------------------------------------------------------------------------------

def _hz_to_mel(f):
    f = np.asarray(f, dtype=np.float64)
    sp, min_hz = 200.0 / 3, 1000.0
    mels = f / sp
    log = f >= min_hz
    return np.where(log, min_hz / sp + np.log(np.maximum(f, 1e-10) / min_hz) / (math.log(6.4) / 27.0), mels)


def _mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    sp, min_hz = 200.0 / 3, 1000.0
    min_mel = min_hz / sp
    return np.where(m >= min_mel, min_hz * np.exp((math.log(6.4) / 27.0) * (m - min_mel)), sp * m)


def slaney_mel(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax=None) -> np.ndarray:
    """(n_mels, 1 + n_fft/2) triangular filters on the Slaney mel scale, area-normalised (librosa's default).

    Bit for bit librosa's: the triangles are computed in float64 and stored as float32 rows, then scaled
    by their float64 area normalisation in place (a float64 product rounded to float32 once more)."""
    fmax = sr / 2 if fmax is None else fmax
    fft = np.fft.rfftfreq(n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fft)
    w = np.zeros((n_mels, fft.size), dtype=np.float32)
    for i in range(n_mels):
        w[i] = np.maximum(0, np.minimum(-ramps[i] / fdiff[i], ramps[i + 2] / fdiff[i + 1]))
    w *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    return w


def kaldi_mel(n_bins: int, n_fft: int, sr: int, low: float = 20.0, high: float = 0.0) -> np.ndarray:
    """(n_bins, n_fft/2 + 1) Kaldi filterbank: triangles on 1127 ln(1 + f/700), unnormalised."""
    nyq = sr / 2
    high = high if high > 0 else nyq + high
    mel = lambda f: 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)   # noqa: E731
    lo, hi = mel(low), mel(high)
    step = (hi - lo) / (n_bins + 1)
    freqs = mel(np.arange(n_fft // 2) * (sr / n_fft))
    w = np.zeros((n_bins, n_fft // 2 + 1))
    for b in range(n_bins):
        left, center, right = lo + b * step, lo + (b + 1) * step, lo + (b + 2) * step
        up = (freqs - left) / (center - left)
        down = (right - freqs) / (right - center)
        w[b, :n_fft // 2] = np.maximum(0.0, np.minimum(up, down))
    return w.astype(np.float32)


# -- features --------------------------------------------------------------------------------------------

def whisper_log_mel(x16: np.ndarray, n_mels: int = 128) -> torch.Tensor:
    """(1, n_mels, frames) Whisper log-mel of 16 kHz audio (n_fft 400, hop 160)."""
    audio = torch.from_numpy(x16)
    stft = torch.stft(audio, 400, 160, window=torch.hann_window(400), return_complex=True)
    power = stft[..., :-1].abs() ** 2
    spec = torch.from_numpy(slaney_mel(16000, 400, n_mels)) @ power
    log = torch.clamp(spec, min=1e-10).log10()
    log = torch.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).unsqueeze(0)


def kaldi_fbank(x16: np.ndarray, n_bins: int = 80) -> torch.Tensor:
    """(frames, n_bins) Kaldi fbank of 16 kHz audio: 25 ms povey frames every 10 ms, pre-emphasis 0.97."""
    x = torch.from_numpy(x16)
    n = 1 + (x.numel() - 400) // 160
    frames = x.as_strided((n, 400), (160, 1))
    frames = frames - frames.mean(dim=1, keepdim=True)
    prev = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - 0.97 * prev
    frames = frames * torch.hann_window(400, periodic=False).pow(0.85)
    power = torch.fft.rfft(F.pad(frames, (0, 112)), dim=1).abs() ** 2          # n_fft 512
    mel = power @ torch.from_numpy(kaldi_mel(n_bins, 512, 16000)).T
    return torch.clamp(mel, min=torch.finfo(torch.float32).eps).log()


def prompt_mel_24k(x24: np.ndarray) -> torch.Tensor:
    """(frames, 80) log-mel at 50 Hz of 24 kHz audio, as the stock's prompt mel."""
    y = torch.from_numpy(x24).view(1, 1, -1)
    pad = (1920 - 480) // 2
    y = F.pad(y, (pad, pad), mode="reflect").view(1, -1)
    spec = torch.view_as_real(torch.stft(y, 1920, 480, 1920, window=torch.hann_window(1920), center=False,
                                         return_complex=True))
    spec = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    spec = torch.from_numpy(slaney_mel(24000, 1920, 80, 0, 8000)) @ spec
    return torch.log(torch.clamp(spec, min=1e-5))[0].T.contiguous()


def _session(path: Path):
    try:
        import onnxruntime as ort
    except ImportError:
        raise ValueError("a .wav prompt needs onnxruntime (pip install duplexcadence[onnx]); "
                         "or give an .npz prompt") from None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def prompt_from_wav(path, checkpoint) -> Prompt:
    path, folder = Path(path), Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    for name in (TOKENIZER, SPEAKER):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"a .wav prompt needs {folder / name}")
    x, sr = read_wav(path)
    x16, x24 = resample(x, sr, 16000), resample(x, sr, 24000)
    tok = _session(folder / TOKENIZER)
    feats = whisper_log_mel(x16).numpy()
    ins = tok.get_inputs()
    tokens = tok.run(None, {ins[0].name: feats, ins[1].name: np.array([feats.shape[2]], dtype=np.int32)})[0]
    spk_sess = _session(folder / SPEAKER)
    fb = kaldi_fbank(x16)
    fb = fb - fb.mean(dim=0, keepdim=True)
    spk = spk_sess.run(None, {spk_sess.get_inputs()[0].name: fb.unsqueeze(0).numpy()})[0]
    from .prompt import make_prompt
    return make_prompt(np.asarray(tokens).reshape(-1), prompt_mel_24k(x24).numpy(), np.asarray(spk).reshape(-1),
                       source=str(path))
