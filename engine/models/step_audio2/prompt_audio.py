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

from .stream import Prompt, make_prompt

TOKENIZER = "speech_tokenizer_v2_25hz.onnx"
SPEAKER = "campplus.onnx"


def resample(x: np.ndarray, sr: int, to: int) -> np.ndarray:
    if sr == to:
        return x
    import soxr
    return soxr.resample(x, sr, to).astype(np.float32)


# -- filterbanks -----------------------------------------------------------------------------------------
#
# The Slaney mel scale: linear below 1 kHz (200/3 Hz per mel, so 1 kHz is mel 15), logarithmic above
# (27 mels per factor 6.4 in frequency):  m(f) = f / (200/3)  for f < 1 kHz,  15 + ln(f / 1 kHz) / (ln 6.4 / 27)
# above. A bank of n triangles sits on n + 2 points equally spaced in mel between fmin and fmax: filter i
# rises linearly from point i to point i + 1 and falls to point i + 2 (both edges measured in Hz), and is
# scaled to unit area, 2 / (f[i + 2] - f[i]).

HZ_PER_MEL = 200.0 / 3          # below the break
BREAK_HZ = 1000.0
MELS_PER_LOG = 27.0 / math.log(6.4)


def hz_to_mel(f) -> np.ndarray:
    """Slaney mels of frequencies ``f`` (Hz, float64)."""
    f = np.asarray(f, dtype=np.float64)
    above = BREAK_HZ / HZ_PER_MEL + np.log(np.maximum(f, 1e-10) / BREAK_HZ) / (1.0 / MELS_PER_LOG)
    return np.where(f >= BREAK_HZ, above, f / HZ_PER_MEL)


def mel_to_hz(m) -> np.ndarray:
    """Frequencies (Hz, float64) of Slaney mels ``m``: the inverse of :func:`hz_to_mel`."""
    m = np.asarray(m, dtype=np.float64)
    brk = BREAK_HZ / HZ_PER_MEL
    return np.where(m >= brk, BREAK_HZ * np.exp((1.0 / MELS_PER_LOG) * (m - brk)), HZ_PER_MEL * m)


def slaney_mel(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax=None) -> np.ndarray:
    """(n_mels, 1 + n_fft/2) unit-area triangles on the Slaney mel scale over the rfft bins' frequencies.

    The triangles are evaluated in float64 and kept as float32 rows; each row is then scaled by its float64
    area factor and rounded to float32 again (the numbers librosa's filters hold, bit for bit)."""
    top = sr / 2 if fmax is None else fmax
    bins = np.fft.rfftfreq(n_fft, d=1.0 / sr)                                   # [F] Hz
    edge = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(top), n_mels + 2))  # [n + 2] Hz
    width = np.diff(edge)                                                       # [n + 1]
    lo, mid, hi = edge[:-2, None], edge[1:-1, None], edge[2:, None]
    rising = (bins[None, :] - lo) / width[:-1, None]                            # 0 at lo, 1 at mid
    falling = (hi - bins[None, :]) / width[1:, None]                            # 1 at mid, 0 at hi
    bank = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    bank *= (2.0 / (hi - lo))                                                   # float64 factor, float32 store
    return bank


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
    """(1, n_mels, frames) Whisper log-mel of 16 kHz audio: |STFT|^2 (400-point periodic Hann, hop 160,
    centred; the last frame dropped) through the Slaney bank, log10 above 1e-10, floored 8 below the
    loudest value of the whole clip, then mapped by (x + 4) / 4."""
    spec = torch.stft(torch.from_numpy(x16), 400, 160, window=torch.hann_window(400), return_complex=True)
    power = spec.abs().pow(2)[..., :-1]
    level = (torch.from_numpy(slaney_mel(16000, 400, n_mels)) @ power).clamp(min=1e-10).log10()
    level = level.clamp(min=level.max() - 8.0)
    return ((level + 4.0) / 4.0)[None]


def kaldi_fbank(x16: np.ndarray, n_bins: int = 80) -> torch.Tensor:
    """(frames, n_bins) Kaldi fbank of 16 kHz audio: 400-sample frames every 160 (only whole ones), each
    made zero-mean, pre-emphasised (x[t] - 0.97 x[t - 1], the first sample against itself), shaped by the
    Povey window (a symmetric Hann to the power 0.85), zero-padded to 512 points; log of the mel energies
    of its power spectrum, floored at float32's epsilon."""
    x = torch.from_numpy(x16)
    count = (x.numel() - 400) // 160 + 1
    frames = x.unfold(0, 400, 160)[:count]
    frames = frames - frames.mean(dim=1, keepdim=True)
    earlier = F.pad(frames[:, :-1], (1, 0), mode="replicate")
    frames = (frames - 0.97 * earlier) * torch.hann_window(400, periodic=False).pow(0.85)
    power = torch.fft.rfft(F.pad(frames, (0, 512 - 400)), dim=1).abs() ** 2
    energies = power @ torch.from_numpy(kaldi_mel(n_bins, 512, 16000)).T
    return energies.clamp(min=torch.finfo(torch.float32).eps).log()


def prompt_mel_24k(x24: np.ndarray) -> torch.Tensor:
    """(frames, 80) log-mel of 24 kHz audio at 50 frames a second (the flow's mel): the signal mirrored by
    720 samples at both ends, 1920-point periodic-Hann frames every 480 (not centred), magnitude
    sqrt(re^2 + im^2 + 1e-9), the 0-8 kHz Slaney bank, natural log above 1e-5."""
    edge = (1920 - 480) // 2
    y = F.pad(torch.from_numpy(x24)[None, None], (edge, edge), mode="reflect")[0]
    spec = torch.stft(y, 1920, 480, 1920, window=torch.hann_window(1920), center=False, return_complex=True)
    mag = (torch.view_as_real(spec).pow(2).sum(-1) + 1e-9).sqrt()
    mel = torch.from_numpy(slaney_mel(24000, 1920, 80, 0, 8000)) @ mag
    return mel.clamp(min=1e-5).log()[0].T.contiguous()


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
    return make_prompt(np.asarray(tokens).reshape(-1), prompt_mel_24k(x24).numpy(), np.asarray(spk).reshape(-1),
                       source=str(path))
