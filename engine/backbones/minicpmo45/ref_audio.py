"""The reference audio's embeddings: one whole clip through the audio encoder, before the first second.

MiniCPM-o 4.5's duplex session starts with its system prompt wrapped around a voice clip (the released
folder's ``assets/HT_ref_audio.wav`` unless another is chosen). The clip does not go through the per-second
streaming path of :mod:`.audio`; it is encoded at once:

1. the clip as float32 mono at 16 kHz (16-bit PCM read as ``sample / 32768``; another rate goes through
   soxr's HQ resampler, then is cut or zero-padded to ``ceil(n * 16000 / rate)`` samples);
2. Whisper's log-mel of a 30 s window: the clip zero-padded to 480,000 samples, a centred STFT (reflect
   padding, periodic Hann of 400, hop 160) whose last frame is dropped, power through the Slaney mel
   filters, ``log10`` clamped at 1e-10, floored at the window's maximum - 8, then ``(x + 4) / 4``; the
   frames the clip reaches (``ceil(n / 160)``) are kept;
3. the encoder's convolutions over all those frames at once (no context cut), positions from 0, every
   layer attending under a chunk mask: position ``i`` sees every position before the end of its own
   one-second chunk (50 positions), nothing after it; final LayerNorm, projector, AvgPool(5).

The modules are the streaming encoder's own (:class:`~.audio.AudioEncoder`: one copy of the weights);
only the attention mask is new. A clip longer than 30 s is refused (the encoder has 1,500 positions).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .audio import HOP, N_FFT, POSITIONS, RATE, AudioEncoder

WINDOW_SECONDS = 30                  # Whisper's feature window; the longest clip taken
WINDOW = WINDOW_SECONDS * RATE       # samples
FLOOR_RANGE = 8.0                    # log10 units below the window's maximum
REFERENCE = Path("assets") / "HT_ref_audio.wav"   # a released folder's voice clip


class ReferenceAudioError(ValueError):
    """A reference clip the prelude cannot take (the message names the file)."""


def choose_clip(folder: Optional[Path], voice: Optional[str]) -> Optional[Path]:
    """The clip the prelude encodes: ``voice`` when it is an audio file (a ``.npz`` voice is token2wav's
    precomputed prompt and holds no audio), else the folder's ``assets/HT_ref_audio.wav``, else None."""
    if voice and Path(voice).suffix.lower() != ".npz":
        return Path(voice).expanduser()
    if folder is not None and (Path(folder) / REFERENCE).is_file():
        return Path(folder) / REFERENCE
    return None


def load_clip(path: Path) -> np.ndarray:
    """The clip as float32 mono at 16 kHz (see the module's step 1)."""
    from engine.audio import resample, to_mono
    from engine.wavio import WavError, open_audio, read_wav
    try:
        with open_audio(path) as r:
            seconds = r.seconds
        if seconds > WINDOW_SECONDS:
            raise ReferenceAudioError(f"reference audio {path}: {seconds:.2f} s; the encoder takes a clip of at "
                                      f"most {WINDOW_SECONDS} s")
        x, rate = read_wav(path, need_audio=True)
    except WavError as e:
        raise ReferenceAudioError(f"reference audio: {e}") from None
    x = to_mono(x)
    if rate != RATE:
        want = int(math.ceil(len(x) * RATE / rate))
        y = resample(x, rate, RATE)
        x = np.zeros(want, dtype=np.float32)
        x[:min(want, len(y))] = y[:want]
    return x


def clip_log_mel(pcm: torch.Tensor, fbank: torch.Tensor) -> torch.Tensor:
    """Whisper's log-mel of one clip ``pcm`` [n <= 480000] float32 at 16 kHz -> [n_mels, ceil(n / 160)]
    (``fbank``: the Slaney filters [n_fft / 2 + 1, n_mels])."""
    n = int(pcm.shape[0])
    window = torch.zeros(1, WINDOW, dtype=torch.float32, device=pcm.device)
    window[0, :n] = pcm.to(torch.float32)
    hann = torch.hann_window(N_FFT, device=pcm.device)
    spec = torch.stft(window, n_fft=N_FFT, hop_length=HOP, window=hann, return_complex=True)   # [1, 201, 3001]
    power = spec[..., :-1].abs() ** 2                                                          # [1, 201, 3000]
    logmel = torch.clamp(fbank.T @ power, min=1e-10).log10()                                  # [1, 80, 3000]
    logmel = torch.maximum(logmel, logmel.amax() - FLOOR_RANGE)
    frames = -(-n // HOP)
    return ((logmel + 4.0) / 4.0)[0, :, :frames]


def chunk_mask(positions: int, chunk: int = POSITIONS, device=None) -> torch.Tensor:
    """Additive attention mask [1, 1, T, T] float32: 0 where key ``j`` lies before the end of query ``i``'s
    chunk (``j < (i // chunk + 1) * chunk``), -inf elsewhere."""
    i = torch.arange(positions, device=device)
    seen = (i // chunk + 1) * chunk                                  # [T]: first key hidden from query i
    blocked = i[None, :] >= seen[:, None]                            # [T, T]
    mask = torch.zeros(1, 1, positions, positions, dtype=torch.float32, device=device)
    return mask.masked_fill_(blocked, float("-inf"))


def encode_clip(enc: AudioEncoder, features: torch.Tensor) -> torch.Tensor:
    """The encoder, projector and pooling over a whole clip's features [n_mels, frames] -> [tokens, llm]."""
    a = enc.a
    dt = enc.conv1.weight.dtype
    h = F.gelu(enc.conv2(F.gelu(enc.conv1(features.to(dt).unsqueeze(0)))))        # [1, d, T]
    t = h.shape[2]
    if t > a.max_positions:
        raise ReferenceAudioError(f"reference audio: {t} encoder positions, more than the encoder's {a.max_positions}")
    x = h.transpose(1, 2) + enc.embed_positions.weight[:t].unsqueeze(0)            # [1, T, d]
    mask = chunk_mask(t, POSITIONS, x.device).to(dt)
    k = torch.empty(a.heads, t, a.head_dim, dtype=dt, device=x.device)
    v = torch.empty_like(k)
    for layer in enc.layers:                                                       # keys/values: this layer's only
        x = layer(x, k, v, k, v, mask=mask)
    x = enc.proj(enc.layer_norm(x))                                                # [1, T, llm]
    return F.avg_pool1d(x.transpose(1, 2), a.pool, a.pool).transpose(1, 2)[0]       # [T // pool, llm]


def reference_embeddings(enc: AudioEncoder, path: Path) -> torch.Tensor:
    """The embeddings [tokens, llm hidden] the prelude feeds for the clip at ``path``."""
    features = clip_log_mel(torch.from_numpy(load_clip(Path(path))), enc.fbank.cpu())   # on the CPU, as the stock
    return encode_clip(enc, features.to(enc.conv1.weight.device))
