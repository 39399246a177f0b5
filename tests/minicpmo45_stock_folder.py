"""A tiny MiniCPM-o 4.5 folder in the released layout that both our loader and MiniCPM-o's own code read.

Written from the main venv (our modules' seeded weights under the released key names), read by our backbone
and by ``tests/stock_loop/run_stock.py`` in the stock venv: config.json (Qwen3 fields, nested Whisper and TTS
configs, the fields MiniCPM-o's config class reads), two safetensors shards + index, a character-level
tokenizer.json with every special token the duplex loop names, tokenizer_config.json, added_tokens.json,
``assets/token2wav`` (flow.yaml, flow.pt, hift.pt at the tiny Step-Audio2 dims) and
``assets/HT_ref_audio.wav`` (16 kHz), plus ``voice.npz``: token2wav's prompt features, handed to both sides in
place of the two ONNX models the folder lacks.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from engine.backbones.minicpmo45.audio import AudioEncoder
from engine.backbones.minicpmo45.dims import TOKEN_NAMES, preset
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.tts import TTS
from engine.models.step_audio2 import weights as T2W
from engine.models.step_audio2.config import preset as t2w_preset

# the tiny preset, its Whisper FFN 4x its width: the stock sizes its projector's input as encoder_ffn_dim / 4
D = replace(preset("tiny"), audio=replace(preset("tiny").audio, ffn=4 * preset("tiny").audio.d_model))
T2W_TINY = t2w_preset("tiny")
# tokens the stock's prompts and processor name besides the protocol's (ids just below those)
EXTRA_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|tts_eos|>",
                  "<image>", "</image>", "<slice>", "</slice>", "<unk>")
REF_SECONDS = 2.3


def specials() -> dict:
    out = {name: getattr(D.tokens, field) for field, name in TOKEN_NAMES.items()}
    low = min(out.values())
    out.update({name: low - 1 - i for i, name in enumerate(EXTRA_SPECIALS)})
    return out


def config() -> dict:
    a, l, t = D.audio, D.llm, D.tts
    return {
        "architectures": ["MiniCPMO"], "model_type": "minicpmo", "hidden_size": l.hidden,
        "num_hidden_layers": l.layers, "num_attention_heads": l.heads, "num_key_value_heads": l.kv_heads,
        "head_dim": l.head_dim, "intermediate_size": l.ffn, "vocab_size": l.vocab, "rope_theta": l.rope_theta,
        "rms_norm_eps": l.eps, "max_position_embeddings": l.max_positions, "tie_word_embeddings": False,
        "attention_bias": False, "hidden_act": "silu", "audio_pool_step": a.pool, "audio_chunk_length": 1.0,
        "init_vision": False, "init_audio": True, "init_tts": True, "torch_dtype": "float32",
        "audio_config": {"model_type": "whisper", "d_model": a.d_model, "encoder_layers": a.layers,
                         "encoder_attention_heads": a.heads, "encoder_ffn_dim": a.ffn, "num_mel_bins": a.n_mels,
                         "max_source_positions": a.max_positions},
        "tts_config": {"backbone_model": "llama", "hidden_size": t.hidden, "num_hidden_layers": t.layers,
                       "num_attention_heads": t.heads, "num_key_value_heads": t.kv_heads,
                       "intermediate_size": t.ffn, "num_text_tokens": t.text_vocab, "num_audio_tokens": t.codes,
                       "num_vq": 1, "audio_bos_token_id": t.audio_bos, "llm_dim": l.hidden,
                       "max_position_embeddings": t.max_positions, "projector_type": "mlp",
                       "audio_tokenizer_type": "s3tokenizer_step_audio", "attn_implementation": "sdpa"},
    }


def tokenizer(path: Path) -> dict:
    """Character level: printable ASCII are ordinary tokens, every special token sits at the top."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    sp = specials()
    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    vocab["\n"] = len(vocab)
    for i in range(len(vocab), min(sp.values())):
        vocab[f"<w{i}>"] = i
    vocab.update(sp)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in sp])
    tok.save(str(path / "tokenizer.json"))
    (path / "added_tokens.json").write_text(json.dumps(sp))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "bos_token": "<|im_start|>",
        "unk_token": "<unk>", "pad_token": "<unk>", "bad_token_ids": [3, 5], "model_max_length": 4096,
        "clean_up_tokenization_spaces": False}))
    return sp


def weights(seed: int, nudge: tuple = (1.0, 1.0)) -> dict:
    """Our modules' seeded weights under the released key names, plus the stock's modules the duplex loop
    never runs (so the stock model loads every tensor from the folder). ``nudge`` scales the LLM head's rows
    of ``<|listen|>`` and ``<|turn_eos|>`` (in that order) so that random weights sometimes listen and end
    their turns."""
    llm, tts, enc = Qwen3(D.llm), TTS(D.tts, D.llm), AudioEncoder(D.audio, D.llm.hidden)
    for i, m in enumerate((llm, tts, enc)):
        seeded_init(m, seed + i, std=0.05)
    out = {f"llm.{k}": v for k, v in llm.state_dict().items()}
    head = out["llm.lm_head.weight"].clone()
    for t, factor in zip((D.tokens.listen, D.tokens.turn_eos), nudge):
        head[t] *= factor
    out["llm.lm_head.weight"] = head
    for k, v in tts.state_dict().items():
        if k == "head_code.0.weight":
            out["tts.head_code.0.parametrizations.weight.original0"] = v.norm(dim=1, keepdim=True) * 1.5
            out["tts.head_code.0.parametrizations.weight.original1"] = v
        else:
            out[f"tts.{k}"] = v
    for k, v in enc.state_dict().items():
        out[("audio_projection_layer." + k[5:]) if k.startswith("proj.") else f"apm.{k}"] = v
    g = torch.Generator().manual_seed(seed + 7)
    h, t = D.llm.hidden, D.tts.hidden
    for name, shape in (("linear1.weight", (t, h)), ("linear1.bias", (t,)), ("linear2.weight", (t, t)),
                        ("linear2.bias", (t,))):
        out[f"tts.projector_spk.{name}"] = torch.randn(*shape, generator=g) * 0.05
    out["tts.model.embed_tokens.weight"] = torch.randn(32000, t, generator=g) * 0.05
    return {k: v.detach().float().clone().contiguous() for k, v in out.items()}


def token2wav(path: Path, seed: int, cfg=T2W_TINY) -> None:
    """``assets/token2wav`` at ``cfg``'s dims: flow.yaml, flow.pt and hift.pt of seeded weights whose vocoder
    makes voiced frames (``stock_step_audio2.voiced``)."""
    from stock_step_audio2 import voiced
    state = voiced(T2W.random_state_dict(cfg, seed), cfg)
    torch.save({k[5:]: v for k, v in state.items() if k.startswith("flow.")}, path / "flow.pt")
    torch.save({"generator." + k[5:]: v for k, v in state.items() if k.startswith("hift.")}, path / "hift.pt")
    (path / "flow.yaml").write_text(FLOW_YAML.format(e=cfg.flow.encoder, d=cfg.flow.dit))


FLOW_YAML = """llm_input_size: 896
flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    output_size: 80
    spk_embed_dim: 192
    output_type: 'mel'
    vocab_size: 6561
    encoder: !new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2
        input_size: 512
        output_size: 512
        input_layer: 'linear'
        pre_lookahead_len: 3
        num_blocks: {e.num_blocks}
        num_up_blocks: {e.num_up_blocks}
        up_stride: 2
        up_scale_factor: 2
        attention_heads: 8
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        key_bias: true
        linear_units: {e.linear_units}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: true
    decoder: !new:cosyvoice2.flow.flow_matching.CausalConditionalCFM
        inference_cfg_rate: 0.7
        estimator: !new:cosyvoice2.flow.decoder_dit.DiT
            in_channels: 320
            out_channels: 80
            mlp_ratio: {d.mlp_ratio}
            depth: {d.depth}
            num_heads: 8
            head_dim: 64
            hidden_size: 512
"""


def ref_audio(path: Path, seed: int) -> np.ndarray:
    """A voiced 16 kHz reference (a gliding tone with harmonics and noise), written as 16-bit PCM."""
    import soundfile as sf
    rng = np.random.RandomState(seed)
    n = int(REF_SECONDS * 16000)
    t = np.arange(n) / 16000.0
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    x = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 + rng.randn(n) * 0.01
    sf.write(str(path), x.astype(np.float32), 16000, subtype="PCM_16")
    return x


def voice(path: Path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 31)
    n = 41
    np.savez(path, prompt_tokens=torch.randint(0, 6561, (n,), generator=g).numpy(),
             prompt_mel=torch.randn(2 * n, 80, generator=g).numpy(),
             speaker_embedding=torch.randn(192, generator=g).numpy())


def write_shards(folder: Path, w: dict) -> None:
    """``w`` as the released layout's two safetensors shards (keys in sorted order, split in half) and
    ``model.safetensors.index.json``."""
    keys = sorted(w)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    weight_map = {}
    for name, ks in shards.items():
        save_file({k: w[k] for k in ks}, str(folder / name))
        weight_map.update({k: name for k in ks})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write(folder: Path, seed: int = 11, nudge: tuple = (1.0, 1.0), t2w=T2W_TINY, t2w_seed=None) -> Path:
    """Write the whole folder (see the module docstring); returns it. ``t2w``: token2wav's dims (a
    :class:`~engine.models.step_audio2.config.T2WConfig`), its weights seeded ``t2w_seed`` (default ``seed``)."""
    folder = Path(folder)
    (folder / "assets" / "token2wav").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config(), indent=2))
    tokenizer(folder)
    write_shards(folder, weights(seed, nudge))
    token2wav(folder / "assets" / "token2wav", seed if t2w_seed is None else t2w_seed, t2w)
    ref_audio(folder / "assets" / "HT_ref_audio.wav", seed)
    voice(folder / "voice.npz", seed)
    return folder


# -- any preset, streamed: ``write(..., size="released")`` / ``python tests/minicpmo45_stock_folder.py DIR --size released``

SHARD_BYTES = 4 << 30                     # released shards of about 4 GiB, as the released checkpoint's
DRAW_ELEMENTS = 1 << 24                   # one float32 draw at most this big (64 MiB) before its bf16 rounding


def dims_of(size: str):
    """A preset with its Whisper FFN 4x its width (the stock sizes its projector from it)."""
    d = preset(size)
    return replace(d, audio=replace(d.audio, ffn=4 * d.audio.d_model))


def weight_specs(d) -> list:
    """(released key, shape, init) of every tensor in the folder, in order, from our modules (the LLM and the
    TTS built on the meta device, no memory; the audio encoder, whose buffers need data, on the CPU, one at a
    time): init is "one" (norms), "zero" (biases), "head_norm:N" (the TTS code head's weight-norm gain), else
    "randn"."""
    def shapes(build):
        return [(k, v.shape) for k, v in build().state_dict().items()]
    with torch.device("meta"):
        parts = [("llm.", shapes(lambda: Qwen3(d.llm))), ("tts.", shapes(lambda: TTS(d.tts, d.llm)))]
    parts.append(("", shapes(lambda: AudioEncoder(d.audio, d.llm.hidden))))
    specs = []
    for prefix, named in parts:
        for k, shape in named:
            v = torch.empty(shape, device="meta")
            kind = ("one" if k.endswith("norm.weight") or "layernorm" in k or "layer_norm" in k else
                    "zero" if k.endswith("bias") else "randn")
            if prefix == "":
                k = ("audio_projection_layer." + k[5:]) if k.startswith("proj.") else f"apm.{k}"
            if prefix == "tts." and k == "head_code.0.weight":
                specs += [("tts.head_code.0.parametrizations.weight.original0", (v.shape[0], 1),
                           f"head_norm:{v.shape[1]}"),
                          ("tts.head_code.0.parametrizations.weight.original1", tuple(v.shape), "randn")]
                continue
            specs.append((prefix + k, tuple(v.shape), kind))
    h, t = d.llm.hidden, d.tts.hidden
    specs += [("tts.projector_spk.linear1.weight", (t, h), "randn"), ("tts.projector_spk.linear1.bias", (t,), "randn"),
              ("tts.projector_spk.linear2.weight", (t, t), "randn"), ("tts.projector_spk.linear2.bias", (t,), "randn"),
              ("tts.model.embed_tokens.weight", (32000, t), "randn")]
    return sorted(specs)


def draw_tensor(shape: tuple, kind: str, seed: int, dtype: torch.dtype, std: float = 0.05) -> torch.Tensor:
    """One tensor in ``dtype``, drawn in float32 blocks of rows (never a float32 copy of the whole tensor)."""
    out = torch.empty(shape, dtype=dtype)
    if kind in ("one", "zero"):
        return out.fill_(1.0 if kind == "one" else 0.0)
    if kind.startswith("head_norm:"):                 # a std row's expected norm x1.5, as the tiny folder's
        return out.fill_(std * float(kind.split(":")[1]) ** 0.5 * 1.5)
    g = torch.Generator().manual_seed(seed)
    flat = out.view(-1)
    for i in range(0, flat.numel(), DRAW_ELEMENTS):
        n = min(DRAW_ELEMENTS, flat.numel() - i)
        flat[i:i + n] = torch.randn(n, generator=g) * std
    return out


def write_streamed(folder: Path, size: str = "released", seed: int = 11, nudge: tuple = (1.0, 1.0),
                   dtype: torch.dtype = torch.bfloat16, shard_bytes: int = SHARD_BYTES) -> Path:
    """The folder at ``size`` with seeded random weights in ``dtype``, written shard by shard: at most one
    shard's tensors and one 64 MiB float32 draw are in memory at once. The rest of the folder is what
    :func:`write` writes, at that preset's dims. Not the tiny folder's values (another draw order)."""
    global D
    folder = Path(folder)
    d = dims_of(size)
    (folder / "assets" / "token2wav").mkdir(parents=True, exist_ok=True)
    saved, D = D, d                                  # config() and tokenizer() read the module's dims
    try:
        cfg = config()
        tokenizer(folder)
    finally:
        D = saved
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    specs = weight_specs(d)
    groups, cur, cur_bytes = [], [], 0
    for spec in specs:
        nbytes = int(np.prod(spec[1])) * torch.empty(0, dtype=dtype).element_size()
        if cur and cur_bytes + nbytes > shard_bytes:
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(spec)
        cur_bytes += nbytes
    groups.append(cur)
    weight_map, index = {}, {k: i for i, (k, _, _) in enumerate(specs)}
    nudged = dict(zip((d.tokens.listen, d.tokens.turn_eos), nudge))
    for n, group in enumerate(groups, 1):
        name = f"model-{n:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for key, shape, kind in group:
            tensors[key] = draw_tensor(shape, kind, seed * 1000003 + index[key], dtype)
            if key == "llm.lm_head.weight":
                for row, factor in nudged.items():
                    tensors[key][row] *= factor
        save_file(tensors, str(folder / name))
        weight_map.update({k: name for k in tensors})
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    token2wav(folder / "assets" / "token2wav", seed, t2w_preset(size))
    ref_audio(folder / "assets" / "HT_ref_audio.wav", seed)
    voice(folder / "voice.npz", seed)
    return folder


def main(argv=None) -> int:
    import argparse
    import sys
    p = argparse.ArgumentParser(description="Write a MiniCPM-o 4.5 folder in the released layout (random weights) "
                                            "that both our loader and the stock loop read.")
    p.add_argument("folder")
    p.add_argument("--size", default="tiny", choices=["tiny", "released"],
                   help="tiny: float32, two shards (the tests' folder); released: bfloat16, ~4 GiB shards, "
                        "written shard by shard")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--nudge", default="4.0,1.8", help="<|listen|>,<|turn_eos|> head-row factors")
    a = p.parse_args(argv)
    try:
        nudge = tuple(float(x) for x in a.nudge.split(","))
        if len(nudge) != 2:
            raise ValueError
    except ValueError:
        print(f"minicpmo45_stock_folder: --nudge takes two numbers, not {a.nudge!r}", file=sys.stderr)
        return 2
    out = write(a.folder, a.seed, nudge) if a.size == "tiny" else write_streamed(a.folder, a.size, a.seed, nudge)
    print(out)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
