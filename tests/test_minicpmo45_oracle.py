"""Our MiniCPM-o 4.5 modules against the transformers classes the stock runtime builds them from (test-only
oracle; the product never imports transformers), bit for bit (``torch.equal``): Qwen3ForCausalLM with a
DynamicCache fed the way the stock duplex loop feeds it (embeddings in chunks, explicit positions; the logits of
a feed as ``StreamDecoder.feed`` takes them: ``lm_head`` over every position, then the last), the TTS's
LlamaModel, and a Whisper encoder layer fed like the stock's streaming encoder (a growing key/value cache).
Same weights through the checkpoint's key names; float32 on the CPU, seeded random inputs.

The stock targets transformers 4.51, whose ``WhisperSdpaAttention`` hands SDPA the plain query at SDPA's own
scale; the installed transformers (5.x) scales the query first and calls SDPA at scale 1, another order of
operations (other bits). The Whisper test therefore runs 4.51's attention sequence (written out below) inside
5.x's encoder layer; the layer norms, MLP and residuals are 5.x's own."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import oracles

from engine.backbones.minicpmo45.audio import EncoderLayer
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.tts import TTS

oracles.require_module(oracles.TRANSFORMERS)
import transformers  # noqa: E402
pytestmark = pytest.mark.oracle
D = preset("tiny")


def _run(model, embeds, positions, cache):
    """One forward of a transformers model over ``embeds`` [1, T, H] with our cache argument's name."""
    params = inspect.signature(model.forward).parameters
    kw = {"cache": cache} if "cache" in params else {"past_key_values": cache}
    return model(inputs_embeds=embeds, position_ids=positions, use_cache=True, output_hidden_states=True, **kw)


def _store(prefix, d_layers, kv_heads, head_dim):
    r = kv_regions(prefix, d_layers, kv_heads, head_dim, 33, 4096, torch.float32, "")
    return make_store(True, r[0], d_layers, 512, "cpu")


def qwen3_reference(d):
    """transformers' Qwen3ForCausalLM at our LLM dims ``d`` (sdpa attention, eval mode, its own weights)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.ffn, num_hidden_layers=d.layers,
                      num_attention_heads=d.heads, num_key_value_heads=d.kv_heads, head_dim=d.head_dim,
                      rope_theta=d.rope_theta, rms_norm_eps=d.eps, max_position_embeddings=d.max_positions,
                      tie_word_embeddings=False, attention_bias=False)
    cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(cfg).eval()


def test_qwen3_matches_transformers_fed_like_the_duplex_loop(one_torch_thread):
    from transformers import DynamicCache
    d = D.llm
    ref = qwen3_reference(d)
    ours = Qwen3(d).eval()
    seeded_init(ours, 8, std=0.1)
    missing = ref.load_state_dict(ours.state_dict(), strict=False)
    assert not missing.unexpected_keys and all("rotary" in k for k in missing.missing_keys)
    cache, kv = DynamicCache(), _store("llm", d.layers, d.kv_heads, d.head_dim)
    g = torch.Generator().manual_seed(0)
    pos = 0
    with torch.no_grad():
        for t in (1, 10, 1, 1, 1, 2, 1, 10, 1):                   # <unit>, audio, decode steps, close, ...
            x = torch.randn(t, d.hidden, generator=g)
            out = _run(ref, x.unsqueeze(0), torch.arange(pos, pos + t).unsqueeze(0), cache)
            h = ours(x, kv)
            assert torch.equal(h, out.hidden_states[-1][0]), f"hidden states differ after a feed of {t}"
            # out.logits: lm_head over all t positions, as the stock's feed(..., return_logits=True)
            assert torch.equal(ours.logits(h), out.logits[0, -1:].float()), f"logits differ after a feed of {t}"
            pos += t


def test_tts_body_matches_transformers_llama(one_torch_thread):
    from transformers import DynamicCache, LlamaConfig, LlamaModel
    d = D.tts
    cfg = LlamaConfig(hidden_size=d.hidden, intermediate_size=d.ffn, num_hidden_layers=d.layers,
                      num_attention_heads=d.heads, num_key_value_heads=d.kv_heads, rms_norm_eps=d.eps,
                      rope_theta=d.rope_theta, max_position_embeddings=d.max_positions, vocab_size=16)
    cfg._attn_implementation = "eager"          # the stock's init_speech_decoder: eager unless flash-attn
    ref = LlamaModel(cfg).eval()
    ours = TTS(d, D.llm).eval()
    seeded_init(ours, 9, std=0.1)
    body = {k[len("model."):]: v for k, v in ours.state_dict().items() if k.startswith("model.")}
    res = ref.load_state_dict(body, strict=False)
    assert not res.unexpected_keys and all("embed_tokens" in k or "rotary" in k for k in res.missing_keys)
    cache, kv = DynamicCache(), _store("tts", d.layers, d.kv_heads, d.head_dim)
    g = torch.Generator().manual_seed(1)
    pos = 0
    with torch.no_grad():
        for t in (8, 1, 1, 1, 5, 1):                                 # a condition, codes, the next condition...
            x = torch.randn(t, d.hidden, generator=g)
            out = _run(ref, x.unsqueeze(0), torch.arange(pos, pos + t).unsqueeze(0), cache)
            want = ours.head_code[0](out.last_hidden_state)[:, -1].float()     # the head over every row
            assert torch.equal(ours(x, kv), want), f"TTS logits differ after a feed of {t}"
            pos += t


def _stock_whisper_attention(attn, cache: list, outputs: int):
    """transformers 4.51's ``WhisperSdpaAttention.forward`` (what the stock's ``MiniCPMWhisperEncoderLayer`` runs
    under ``attn_implementation="sdpa"``) over ``attn``'s weights, its DynamicCache a list [keys, values]:
    each projection split into heads and made contiguous, the new keys/values appended to the cache's
    (``torch.cat`` on the time axis), SDPA at its default scale, no mask, then ``out_proj``. ``outputs``: how many
    values the installed encoder layer unpacks (3 in transformers 4.x, 2 in 5.x)."""
    def forward(hidden_states, attention_mask=None, **_):
        b, t, _ = hidden_states.shape
        heads = lambda y: y.view(b, -1, attn.num_heads, attn.head_dim).transpose(1, 2).contiguous()  # noqa: E731
        q, k, v = (heads(p(hidden_states)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        if cache:
            k, v = torch.cat([cache[0], k], dim=-2), torch.cat([cache[1], v], dim=-2)
        cache[:] = [k, v]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
        return (attn.out_proj(o.transpose(1, 2).reshape(b, t, -1)),) + (None,) * (outputs - 1)
    return forward


def test_whisper_encoder_layer_matches_transformers(one_torch_thread):
    """Three streaming seconds of 50 positions: each attends over the cache plus itself, as the stock encoder."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoderLayer
    a = D.audio
    cfg = WhisperConfig(d_model=a.d_model, encoder_layers=1, encoder_attention_heads=a.heads, encoder_ffn_dim=a.ffn,
                        num_mel_bins=a.n_mels, activation_function="gelu")
    cfg._attn_implementation = "sdpa"
    ref = WhisperEncoderLayer(cfg).eval()
    ours = EncoderLayer(a).eval()
    seeded_init(ours, 10, std=0.1)
    ref.load_state_dict(ours.state_dict())
    cache: list = []
    v4 = "layer_head_mask" in inspect.signature(ref.forward).parameters          # transformers 4.x's layer
    ref.self_attn.forward = _stock_whisper_attention(ref.self_attn, cache, outputs=3 if v4 else 2)
    extra = {"layer_head_mask": None} if v4 else {}
    k_buf, v_buf = torch.empty(a.heads, 150, a.head_dim), torch.empty(a.heads, 150, a.head_dim)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n in (50, 100, 150):                                   # positions held after this second
            x = torch.randn(1, 50, a.d_model, generator=g)
            got = ours(x, k_buf[:, :n], v_buf[:, :n], k_buf[:, n - 50:n], v_buf[:, n - 50:n])
            want = ref(x, attention_mask=None, **extra)
            want = want[0] if isinstance(want, tuple) else want
            assert torch.equal(got, want), f"encoder layer differs at {n} positions"
    assert cache[0].shape[2] == 150 and torch.equal(cache[0][0], k_buf)           # the same keys were kept
