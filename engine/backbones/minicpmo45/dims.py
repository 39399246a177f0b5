"""MiniCPM-o 4.5 dimensions: audio encoder, LLM, TTS and the duplex protocol's token ids.

Presets by name (``released``: the published checkpoint's sizes; ``tiny``: the same structure at toy
width for CPUs and tests), and :func:`dims_from_config` reading a released ``config.json`` (Qwen3
fields at the top level, nested ``audio_config`` (Whisper) and ``tts_config``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

from engine import safeload


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
    length_penalty: float = 1.05         # on <|turn_eos|>: what the demo's duplex page sends (its config 1.1)
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


# the ranges config.json's fields may take for this model family (the released values sit well inside)
MAX_WIDTH = 1 << 14          # hidden sizes, model widths
MAX_FFN = 1 << 17
MAX_LAYERS = 256
MAX_HEADS = 256
MAX_VOCAB = 1 << 20          # Qwen3's 151,748 ids fit four times over
MAX_POSITIONS = 1 << 20


def _llm(cfg: Mapping, where: str) -> LLMDims:
    i, n = safeload.integer, safeload.number
    hidden = i(cfg, "hidden_size", where, 1, MAX_WIDTH)
    heads = i(cfg, "num_attention_heads", where, 1, MAX_HEADS)
    kv = i(cfg, "num_key_value_heads", where, 1, MAX_HEADS, heads)
    head_dim = i(cfg, "head_dim", where, 2, 1024, max(2, hidden // heads))
    if heads % kv or head_dim % 2:
        raise ValueError(f"{where}: num_key_value_heads {kv} must divide num_attention_heads {heads}, and "
                         f"head_dim {head_dim} must be even")
    return LLMDims(hidden=hidden, layers=i(cfg, "num_hidden_layers", where, 1, MAX_LAYERS), heads=heads,
                   kv_heads=kv, head_dim=head_dim, ffn=i(cfg, "intermediate_size", where, 1, MAX_FFN),
                   vocab=i(cfg, "vocab_size", where, 16, MAX_VOCAB),
                   rope_theta=n(cfg, "rope_theta", where, 1.0, 1e12, 1_000_000.0),
                   eps=n(cfg, "rms_norm_eps", where, 1e-12, 0.1, 1e-6),
                   max_positions=i(cfg, "max_position_embeddings", where, 16, MAX_POSITIONS, 40960))


def _audio(a, pool: int, aw: str) -> AudioDims:
    i = safeload.integer
    d_model = i(a, "d_model", aw, 1, MAX_WIDTH)
    heads = i(a, "encoder_attention_heads", aw, 1, MAX_HEADS)
    if d_model % heads:
        raise ValueError(f"{aw}: encoder_attention_heads {heads} must divide d_model {d_model}")
    return AudioDims(n_mels=i(a, "num_mel_bins", aw, 1, 512, 80), d_model=d_model,
                     layers=i(a, "encoder_layers", aw, 1, MAX_LAYERS), heads=heads,
                     ffn=i(a, "encoder_ffn_dim", aw, 1, MAX_FFN),
                     max_positions=i(a, "max_source_positions", aw, 16, 1 << 16, 1500), pool=pool)


def _tts(t, tw: str) -> TTSDims:
    i = safeload.integer
    hidden = i(t, "hidden_size", tw, 1, MAX_WIDTH, 768)
    heads = i(t, "num_attention_heads", tw, 1, MAX_HEADS, 12)
    kv = i(t, "num_key_value_heads", tw, 1, MAX_HEADS, heads)
    if hidden % heads or heads % kv or (hidden // heads) % 2:
        raise ValueError(f"{tw}: num_attention_heads {heads} must divide hidden_size {hidden} into heads of even "
                         f"size, and num_key_value_heads {kv} must divide the heads")
    text_vocab = i(t, "num_text_tokens", tw, 16, MAX_VOCAB, 152064)
    if i(t, "num_vq", tw, 1, 64, 1) != 1:
        raise ValueError(f"{tw}: num_vq must be 1 (one code per step)")
    return TTSDims(hidden=hidden, layers=i(t, "num_hidden_layers", tw, 1, MAX_LAYERS, 20), heads=heads, kv_heads=kv,
                   ffn=i(t, "intermediate_size", tw, 1, MAX_FFN, 3072), text_vocab=text_vocab,
                   codes=i(t, "num_audio_tokens", tw, 2, 1 << 16, 6562),
                   audio_bos=i(t, "audio_bos_token_id", tw, 0, text_vocab - 1, 151687),
                   max_positions=i(t, "max_position_embeddings", tw, 16, MAX_POSITIONS, 4096))


def parameters(d: Dims) -> int:
    """About how many weights the LLM, the audio encoder and the TTS of ``d`` hold."""
    l, a, t = d.llm, d.audio, d.tts
    llm = 2 * l.vocab * l.hidden + l.layers * (2 * l.hidden * l.heads * l.head_dim
                                               + 2 * l.hidden * l.kv_heads * l.head_dim + 3 * l.hidden * l.ffn)
    audio = a.layers * (4 * a.d_model ** 2 + 2 * a.d_model * a.ffn) + a.d_model * l.hidden + l.hidden ** 2
    tts = (t.text_vocab + 2 * t.codes) * t.hidden + t.layers * (4 * t.hidden ** 2 + 3 * t.hidden * t.ffn) \
        + 2 * l.hidden * t.hidden
    return llm + audio + tts


def dims_from_config(cfg: Mapping, tokens: Optional[SpecialTokens] = None, where: str = "config.json") -> Dims:
    """Dimensions from a released ``config.json``: every field typed (whole numbers are not bools or
    lists, numbers finite) and within this model family's ranges, heads dividing the widths, and the
    weights it implies within this machine's memory; ValueError (one line) naming the field otherwise."""
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{where}: wrong type, a JSON object is needed")
    llm = _llm(cfg, where)
    pool = safeload.integer(cfg, "audio_pool_step", where, 1, 64, 5)
    audio = _audio(_need(cfg, "audio_config", where), pool, where + " audio_config")
    tts = _tts(_need(cfg, "tts_config", where), where + " tts_config")
    d = Dims(audio=audio, llm=llm, tts=tts, tokens=tokens or SpecialTokens())
    safeload.check_memory(2 * parameters(d), where, f"a model of {parameters(d) / 1e9:,.1f} billion weights")
    return d


def _need(cfg: Mapping, key: str, where: str):
    if key not in cfg:
        raise ValueError(f"{where} lacks {key!r}")
    return cfg[key]
