"""MiniCPM-o 4.5 dimensions: audio encoder, LLM, TTS and the duplex protocol's token ids.

Presets by name (``released``: the published checkpoint's sizes; ``tiny``: the same structure at toy
width for CPUs and tests), and :func:`dims_from_config` reading a released ``config.json`` (Qwen3
fields at the top level, nested ``audio_config`` (Whisper) and ``tts_config``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Mapping, Optional


@dataclass(frozen=True)
class AudioDims:
    """Whisper-style streaming encoder + projector (16 kHz log-mel in, LLM-width tokens out)."""

    n_mels: int = 80
    d_model: int = 1024
    layers: int = 24
    heads: int = 16
    ffn: int = 4096
    max_positions: int = 1500      # the stock resets its encoder cache when it would reach this
    pool: int = 5                  # AvgPool1d over encoder positions: 50 per second -> 10 tokens
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


@dataclass(frozen=True)
class LLMDims:
    """Qwen3 decoder (RMSNorm on q and k per head, GQA, untied lm_head)."""

    hidden: int = 4096
    layers: int = 36
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 12288
    vocab: int = 151748
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6
    max_positions: int = 40960


@dataclass(frozen=True)
class TTSDims:
    """The TTS: a Llama decoder conditioned on LLM text tokens and hidden states, one code head."""

    hidden: int = 768
    layers: int = 20
    heads: int = 12
    kv_heads: int = 12
    ffn: int = 3072
    text_vocab: int = 152064
    codes: int = 6562              # speech codes 0..6560 + EOS 6561
    audio_bos: int = 151687        # text id whose emb_text embedding ends each condition
    rope_theta: float = 10000.0
    eps: float = 1e-6
    max_positions: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def eos(self) -> int:
        return self.codes - 1


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids of the duplex protocol (from the tokenizer's added tokens)."""

    unit: int = 151683
    unit_end: int = 151684
    listen: int = 151705
    speak: int = 151706
    tts_bos: int = 151703
    turn_eos: int = 151717
    chunk_eos: int = 151718
    chunk_tts_eos: int = 151721
    tts_pad: int = 151722

    @property
    def chunk_terminators(self) -> tuple:
        return (self.listen, self.chunk_eos, self.chunk_tts_eos)


#: added_tokens.json names of the protocol tokens, by SpecialTokens field
TOKEN_NAMES: Dict[str, str] = {
    "unit": "<unit>", "unit_end": "</unit>", "listen": "<|listen|>", "speak": "<|speak|>",
    "tts_bos": "<|tts_bos|>", "turn_eos": "<|turn_eos|>", "chunk_eos": "<|chunk_eos|>",
    "chunk_tts_eos": "<|chunk_tts_eos|>", "tts_pad": "<|tts_pad|>",
}


@dataclass(frozen=True)
class Sampling:
    """The stock duplex defaults (MiniCPM-o-Demo ``DuplexCapability``)."""

    temperature: float = 0.7
    top_k: int = 20
    top_p: float = 0.8
    repetition_penalty: float = 1.05
    repetition_window: int = 512
    length_penalty: float = 1.1          # on <|turn_eos|>
    max_tokens_per_unit: int = 20        # step 19 is forced to <|chunk_eos|>
    tts_temperature: float = 0.8
    tts_repetition_penalty: float = 1.05
    tts_repetition_window: int = 16
    tts_steps: int = 26                  # 26 steps give the 25 codes of a speaking second
    max_chars_per_unit: int = 28         # with a tokenizer: a unit's text stops before 28 characters


@dataclass(frozen=True)
class Dims:
    audio: AudioDims = field(default_factory=AudioDims)
    llm: LLMDims = field(default_factory=LLMDims)
    tts: TTSDims = field(default_factory=TTSDims)
    tokens: SpecialTokens = field(default_factory=SpecialTokens)
    sampling: Sampling = field(default_factory=Sampling)


def _tiny_tokens(vocab: int) -> SpecialTokens:
    top = vocab - 1
    names = list(TOKEN_NAMES)
    return SpecialTokens(**{n: top - i for i, n in enumerate(names)})


_TINY_VOCAB = 256
PRESETS: Dict[str, Dims] = {
    "released": Dims(),
    "tiny": Dims(
        audio=AudioDims(d_model=32, layers=2, heads=4, ffn=64, max_positions=150),
        llm=LLMDims(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=_TINY_VOCAB),
        tts=TTSDims(hidden=32, layers=2, heads=4, kv_heads=4, ffn=64, text_vocab=_TINY_VOCAB,
                    audio_bos=_TINY_VOCAB - 20),
        tokens=_tiny_tokens(_TINY_VOCAB)),
}


def preset(size: str) -> Dims:
    if size not in PRESETS:
        raise ValueError(f"unknown MiniCPM-o 4.5 size {size!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[size]


def _need(cfg: Mapping, key: str, where: str):
    if key not in cfg:
        raise ValueError(f"{where} lacks {key!r}")
    return cfg[key]


def dims_from_config(cfg: Mapping, tokens: Optional[SpecialTokens] = None, where: str = "config.json") -> Dims:
    """Dimensions from a released ``config.json`` (ValueError naming the missing or bad field)."""
    try:
        n_heads = int(_need(cfg, "num_attention_heads", where))
        llm = LLMDims(hidden=int(_need(cfg, "hidden_size", where)),
                      layers=int(_need(cfg, "num_hidden_layers", where)), heads=n_heads,
                      kv_heads=int(cfg.get("num_key_value_heads", n_heads)),
                      head_dim=int(cfg.get("head_dim", int(cfg["hidden_size"]) // n_heads)),
                      ffn=int(_need(cfg, "intermediate_size", where)), vocab=int(_need(cfg, "vocab_size", where)),
                      rope_theta=float(cfg.get("rope_theta", 1_000_000.0)), eps=float(cfg.get("rms_norm_eps", 1e-6)),
                      max_positions=int(cfg.get("max_position_embeddings", 40960)))
        a = _need(cfg, "audio_config", where)
        aw = where + " audio_config"
        audio = AudioDims(n_mels=int(a.get("num_mel_bins", 80)), d_model=int(_need(a, "d_model", aw)),
                          layers=int(_need(a, "encoder_layers", aw)),
                          heads=int(_need(a, "encoder_attention_heads", aw)),
                          ffn=int(_need(a, "encoder_ffn_dim", aw)),
                          max_positions=int(a.get("max_source_positions", 1500)),
                          pool=int(cfg.get("audio_pool_step", 5)))
        t = _need(cfg, "tts_config", where)
        th = int(t.get("num_attention_heads", 12))
        tts = TTSDims(hidden=int(t.get("hidden_size", 768)), layers=int(t.get("num_hidden_layers", 20)), heads=th,
                      kv_heads=int(t.get("num_key_value_heads", th)), ffn=int(t.get("intermediate_size", 3072)),
                      text_vocab=int(t.get("num_text_tokens", 152064)), codes=int(t.get("num_audio_tokens", 6562)),
                      audio_bos=int(t.get("audio_bos_token_id", 151687)),
                      max_positions=int(t.get("max_position_embeddings", 4096)))
    except (TypeError, AttributeError, ValueError) as e:
        if isinstance(e, ValueError) and str(e).startswith(where):
            raise
        raise ValueError(f"{where}: a field has the wrong type ({e})") from None
    if audio.d_model % audio.heads or tts.hidden % tts.heads or llm.heads % llm.kv_heads:
        raise ValueError(f"{where}: head counts do not divide the widths")
    if int(t.get("num_vq", 1)) != 1:
        raise ValueError(f"{where}: tts_config num_vq must be 1 (one code per step)")
    return Dims(audio=audio, llm=llm, tts=tts, tokens=tokens or SpecialTokens())


def with_tokens(d: Dims, tokens: SpecialTokens) -> Dims:
    return replace(d, tokens=tokens)
