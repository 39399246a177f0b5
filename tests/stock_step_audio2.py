"""Test-only oracle: the stock Step-Audio2 token2wav (PyPI ``minicpmo``, module ``stepaudio2``).

Builds the stock flow (``CausalMaskedDiffWithXvec`` + ``UpsampleConformerEncoderV2`` + ``CausalConditionalCFM``
/ ``DiT``) and ``HiFTGenerator`` at given dims, loads *our* seeded random state dicts into them (strict), and
streams tokens through the stock ``Token2wav.stream`` method itself (its cache truncation, cross-fade and
first/last-chunk bookkeeping), with the prompt handed in instead of computed from a wav.

The stock package imports things the decoder never uses here (onnxruntime, torchaudio, s3tokenizer,
hyperpyyaml, librosa, scipy); they are stubbed only while the stock modules import, then removed from
``sys.modules`` again. ``scipy.signal.get_window('hann', n, fftbins=True)`` is stubbed with scipy's own
formula (general cosine over ``n + 1`` points, truncated). Only this file imports the stock package.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import os
import sys
import types

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.config import preset
from engine.models.step_audio2.stream import Prompt, flow_noise

MODULES = ("onnxruntime", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "s3tokenizer",
           "hyperpyyaml", "librosa", "librosa.filters", "scipy", "scipy.signal", "scipy.io", "scipy.io.wavfile")


def scipy_hann(name, n, fftbins=True):
    """scipy.signal.get_window('hann', n, fftbins=True), as scipy computes it."""
    assert name == "hann" and fftbins
    fac = np.linspace(-np.pi, np.pi, n + 1)
    w = np.zeros(n + 1)
    for k, a in enumerate((0.5, 0.5)):
        w += a * np.cos(k * fac)
    return w[:-1]


def _missing(name: str) -> bool:
    try:
        importlib.import_module(name)
        return False
    except Exception:
        return True


class _StubModule(types.ModuleType):
    """A module the stock code imports but the decoder never calls: every name is a callable that raises."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def unavailable(*a, **kw):
            raise RuntimeError(f"{self.__name__}.{attr} is stubbed in the test oracle")
        return unavailable


@contextlib.contextmanager
def _stubs():
    added = []
    for name in MODULES:
        if name in sys.modules or not _missing(name):
            continue
        m = _StubModule(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__path__ = []
        sys.modules[name] = m
        added.append(name)
    for name in added:                      # attributes the stock modules import by name
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, sys.modules[name])
    if "scipy.signal" in added:
        sys.modules["scipy.signal"].get_window = scipy_hann
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def _load():
    """Import the stock modules (without the package's heavy ``__init__``)."""
    if "stepaudio2.token2wav" in sys.modules:
        return sys.modules["stepaudio2.token2wav"]
    spec = importlib.util.find_spec("stepaudio2")
    if spec is None:
        raise ImportError("stepaudio2 (pip install --no-deps minicpmo==0.1.2) is not installed")
    pkg = types.ModuleType("stepaudio2")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["stepaudio2"] = pkg
    with _stubs():
        for name in ("cosyvoice2.flow.flow", "cosyvoice2.flow.flow_matching", "cosyvoice2.flow.decoder_dit",
                     "cosyvoice2.transformer.upsample_encoder_v2", "flashcosyvoice.modules.hifigan",
                     "token2wav"):
            importlib.import_module("stepaudio2." + name)
    return sys.modules["stepaudio2.token2wav"]


def available() -> bool:
    try:
        _load()
        return True
    except ImportError:
        return False


def build_flow(cfg):
    """The stock flow at the dims of our :class:`~engine.models.step_audio2.config.FlowConfig`."""
    _load()
    from stepaudio2.cosyvoice2.flow.decoder_dit import DiT
    from stepaudio2.cosyvoice2.flow.flow import CausalMaskedDiffWithXvec
    from stepaudio2.cosyvoice2.flow.flow_matching import CausalConditionalCFM
    from stepaudio2.cosyvoice2.transformer.upsample_encoder_v2 import UpsampleConformerEncoderV2
    e, d = cfg.encoder, cfg.dit
    enc = UpsampleConformerEncoderV2(
        input_size=e.input_size, output_size=e.output_size, input_layer="linear",
        pre_lookahead_len=e.pre_lookahead, num_blocks=e.num_blocks, num_up_blocks=e.num_up_blocks,
        up_stride=e.up_stride, up_scale_factor=float(e.up_stride), attention_heads=e.heads,
        pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn", key_bias=True,
        linear_units=e.linear_units, dropout_rate=0.1, positional_dropout_rate=0.1, attention_dropout_rate=0.1,
        normalize_before=True)
    est = DiT(in_channels=d.in_channels, out_channels=d.out_channels, mlp_ratio=d.mlp_ratio, depth=d.depth,
              num_heads=d.heads, head_dim=d.head_dim, hidden_size=d.hidden)
    flow = CausalMaskedDiffWithXvec(
        input_size=cfg.input_size, output_size=cfg.output_size, spk_embed_dim=cfg.spk_embed_dim,
        output_type="mel", vocab_size=cfg.vocab_size, encoder=enc,
        decoder=CausalConditionalCFM(estimator=est, inference_cfg_rate=cfg.cfg_rate))
    return flow.eval()


def build_hift(cfg):
    _load()
    from stepaudio2.flashcosyvoice.modules.hifigan import ConvRNNF0Predictor, HiFTGenerator
    f0 = ConvRNNF0Predictor(num_class=1, in_channels=cfg.in_channels, cond_channels=cfg.f0_channels)
    h = HiFTGenerator(
        in_channels=cfg.in_channels, base_channels=cfg.base_channels, nb_harmonics=cfg.nb_harmonics,
        sampling_rate=cfg.sampling_rate, upsample_rates=list(cfg.upsample_rates),
        upsample_kernel_sizes=list(cfg.upsample_kernel_sizes),
        istft_params={"n_fft": cfg.n_fft, "hop_len": cfg.hop_len},
        resblock_kernel_sizes=list(cfg.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(d) for d in cfg.resblock_dilation_sizes],
        source_resblock_kernel_sizes=list(cfg.source_resblock_kernel_sizes),
        source_resblock_dilation_sizes=[list(d) for d in cfg.source_resblock_dilation_sizes],
        f0_predictor=f0)
    return h.eval()


class _TorchOnDevice(types.ModuleType):
    """``torch`` as token2wav.py sees it: ``device='cuda'`` literals go to the oracle's device."""

    def __init__(self, device):
        super().__init__("torch")
        self._device = torch.device(device)

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name in ("tensor", "zeros", "ones"):
            def on_device(*a, **kw):
                if kw.get("device") == "cuda":
                    kw["device"] = self._device
                return attr(*a, **kw)
            return on_device
        return attr


class StockStream:
    """Runs the stock ``Token2wav.stream`` over our tokens, with given modules, prompt and noise."""

    def __init__(self, flow, hift, prompt_tokens, prompt_mel, spk, device, noise=None, n_timesteps=10):
        t2w_mod = _load()
        self.device = torch.device(device)
        self.flow = flow.to(self.device)
        self.hift = hift.to(self.device)
        if noise is not None:
            self.flow.decoder.rand_noise = noise.to(self.device)
        t2w = object.__new__(t2w_mod.Token2wav)
        t2w.float16, t2w.n_timesteps = False, n_timesteps
        t2w.flow, t2w.hift = self.flow, self.hift
        t2w.mel_cache_len = 8
        t2w.source_cache_len = int(t2w.mel_cache_len * 480)
        t2w.speech_window = torch.from_numpy(np.hamming(2 * t2w.source_cache_len)).to(self.device)
        ptok = prompt_tokens.reshape(1, -1).to(torch.int32).to(self.device)
        pmel = prompt_mel.reshape(1, -1, prompt_mel.shape[-1]).to(self.device)
        pmel = torch.nn.functional.pad(pmel, (0, 0, 0, ptok.shape[1] * flow.up_rate - pmel.shape[1]),
                                       mode="replicate")
        emb = spk.reshape(1, -1).to(self.device)
        t2w.cache = (ptok, torch.tensor([ptok.shape[1]], dtype=torch.int32, device=self.device), emb, pmel,
                     torch.tensor([pmel.shape[1]], dtype=torch.int32, device=self.device))
        t2w._prepare_prompt = lambda wav: t2w.cache
        t2w_mod.torch = _TorchOnDevice(self.device)
        self._mod = t2w_mod
        self.t2w = t2w
        with _quiet():
            t2w.stream_cache, t2w.hift_cache_dict = t2w.set_stream_cache(None)

    def chunks(self, tokens):
        """Yield (chunk tokens, last_chunk) exactly as the duplex loop feeds Token2wav.stream."""
        tokens = [int(t) for t in tokens]
        i = 0
        while True:
            if 25 * i + 28 >= len(tokens):
                yield tokens[25 * i:], True
                return
            yield tokens[25 * i:25 * i + 28], False
            i += 1

    def stream(self, tokens, chunks=None):
        """Every chunk's float32 waveform (numpy, 1-D) from the stock stream method; ``chunks``: (tokens, last)
        pairs to feed instead of :meth:`chunks` of ``tokens`` (MiniCPM-o's loop: a turn's last 3 tokens alone)."""
        outs = []
        for chunk, last in (self.chunks(tokens) if chunks is None else chunks):
            wav = self.t2w.stream(chunk, None, last_chunk=last, return_waveform=True)
            outs.append(np.asarray(wav, dtype=np.float32).reshape(-1))
        return outs


@contextlib.contextmanager
def _quiet():
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        yield


# -- shared set-up of the Step-Audio2 tests ---------------------------------------------------------------


@dataclass
class Case:
    """One seeded test case: weights, prompt, tokens, seed."""

    size: str
    state: dict
    prompt: Prompt
    tokens: List[int]
    seed: int

    @property
    def cfg(self):
        return preset(self.size)


# Plain random weights leave the vocoder's f0 near 0.2 Hz (every frame unvoiced: the sine branch is multiplied
# by zero) and a quarter of the samples at the clamp. These factors, applied to the seeded weights, put f0 in
# the speech range (|400 z + 120| Hz for the classifier's output z, a few frames still unvoiced) and the
# output well inside the clamp (log-magnitude channels 0.15x, 1 lower), and make the excitation matter (5x).
F0_GAIN, F0_BIAS_HZ = 400.0, 120.0
LOG_MAG_GAIN, LOG_MAG_SHIFT = 0.15, -1.0
SOURCE_GAIN = 5.0


def voiced(state: dict, cfg) -> dict:
    """A copy of ``state`` whose HiFT produces voiced frames and unclamped speech (see the factors above)."""
    out = dict(state)
    mag = cfg.hift.n_fft // 2 + 1                           # conv_post channels [0, mag) are log-magnitudes
    out["hift.f0_predictor.classifier.weight"] = state["hift.f0_predictor.classifier.weight"] * F0_GAIN
    out["hift.f0_predictor.classifier.bias"] = state["hift.f0_predictor.classifier.bias"] + F0_BIAS_HZ
    gain = state["hift.conv_post.parametrizations.weight.original0"].clone()    # [18, 1, 1]
    gain[:mag] *= LOG_MAG_GAIN
    out["hift.conv_post.parametrizations.weight.original0"] = gain
    bias = state["hift.conv_post.bias"].clone()                                  # [18]
    bias[:mag] += LOG_MAG_SHIFT
    out["hift.conv_post.bias"] = bias
    out["hift.m_source.l_linear.weight"] = state["hift.m_source.l_linear.weight"] * SOURCE_GAIN
    return out


def make_case(size: str, prompt_tokens: int, n_tokens: int, seed: int = 3) -> Case:
    """Fresh random weights (made :func:`voiced`), prompt and tokens (lengths chosen by the caller: not
    multiples of anything)."""
    cfg = preset(size)
    g = torch.Generator().manual_seed(seed)
    prompt = Prompt(torch.randint(0, 6561, (1, prompt_tokens), generator=g),
                    torch.randn(1, 2 * prompt_tokens, 80, generator=g), torch.randn(1, 192, generator=g))
    tokens = torch.randint(0, 6561, (n_tokens,), generator=g).tolist()
    return Case(size, voiced(W.random_state_dict(cfg, seed), cfg), prompt, tokens, seed)


def stock_outputs(case: "Case", device: str = "cpu", f0_log: Optional[list] = None, chunks=None
                  ) -> List[np.ndarray]:
    """The stock package's per-chunk audio for ``case`` (its own Token2wav.stream); every f0 the stock's
    predictor returns (``[1, T]`` Hz per call) is appended to ``f0_log`` when given; ``chunks``: see
    :meth:`StockStream.stream`."""
    flow, hift = build_flow(case.cfg.flow), build_hift(case.cfg.hift)
    if f0_log is not None:
        hift.f0_predictor.register_forward_hook(lambda mod, args, f0: f0_log.append(f0.detach().cpu()))
    flow.load_state_dict({k[5:]: v for k, v in case.state.items() if k.startswith("flow.")}, strict=True)
    hift.load_state_dict({k[5:]: v for k, v in case.state.items() if k.startswith("hift.")}, strict=True)
    st = StockStream(flow, hift, case.prompt.tokens, case.prompt.mel, case.prompt.spk, device,
                     noise=flow_noise(case.seed))
    torch.manual_seed(case.seed)
    with torch.no_grad():
        return st.stream(case.tokens, chunks)


def assert_chunks_equal(ours: List[np.ndarray], ref: List[np.ndarray]) -> None:
    assert len(ours) == len(ref), (len(ours), len(ref))
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape, f"chunk {i}: {a.shape} vs stock {b.shape}"
        assert np.isfinite(b).all() and np.abs(b).max() > 1e-3, f"chunk {i}: stock audio is degenerate"
        assert torch.equal(torch.from_numpy(a), torch.from_numpy(b)), \
            f"chunk {i}: max |diff| {np.abs(a - b).max():.3g}"
