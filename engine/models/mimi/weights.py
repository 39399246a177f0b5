"""Mimi decoder weights in moshi's layout: key names, seeded random weights, checkpoint loading.

A Mimi checkpoint (``tokenizer-e351c8d8-checkpoint125.safetensors``) holds the whole codec under
moshi's module names; the decoder needs the quantizer's codebooks and output projections, the
upsample, the decoder transformer and the SEANet decoder. :func:`decoder_keys` lists exactly those
keys with their shapes for a :class:`~engine.models.mimi.config.MimiConfig`; :func:`load_checkpoint`
reads a file and checks every key (missing or mis-shaped keys give one clear error);
:func:`random_state` makes seeded random weights in the same layout (for tests and benchmarks).
A codebook's vectors are moshi's ``embedding_sum / cluster_usage.clamp(min=1e-5)``.
"""
from __future__ import annotations

import os
from typing import Dict, Tuple

import torch

from engine.checkpoints import pick_expected

from .config import MimiConfig

CODEBOOK_EPS = 1e-5
TR = "decoder_transformer.transformer.layers"
#: older checkpoints name the attention projections without the per-step index
ALIASES = {"self_attn.in_projs.0.weight": "self_attn.in_proj_weight",
           "self_attn.out_projs.0.weight": "self_attn.out_proj.weight"}


def seanet_indices(cfg: MimiConfig) -> Dict[str, int]:
    """Index of each SEANet decoder layer in moshi's ``decoder.model`` Sequential."""
    per_stage = 2 + cfg.n_residual_layers          # ELU, convtr, residual blocks
    idx = {"conv_in": 0}
    for s in range(len(cfg.ratios)):
        base = 1 + s * per_stage
        idx[f"stage{s}.convtr"] = base + 1
        for j in range(cfg.n_residual_layers):
            idx[f"stage{s}.res{j}"] = base + 2 + j
    idx["conv_out"] = 2 + len(cfg.ratios) * per_stage
    return idx


def _codebook_keys(cfg: MimiConfig) -> Dict[str, Tuple[int, ...]]:
    keys = {}
    for part, n in (("rvq_first", cfg.n_q_semantic), ("rvq_rest", cfg.n_q - cfg.n_q_semantic)):
        keys[f"quantizer.{part}.output_proj.weight"] = (cfg.dimension, cfg.codebook_dim, 1)
        for j in range(n):
            pre = f"quantizer.{part}.vq.layers.{j}._codebook."
            keys[pre + "embedding_sum"] = (cfg.bins, cfg.codebook_dim)
            keys[pre + "cluster_usage"] = (cfg.bins,)
    return keys


def _transformer_keys(cfg: MimiConfig) -> Dict[str, Tuple[int, ...]]:
    d, ff = cfg.dimension, cfg.dim_feedforward
    keys = {}
    for i in range(cfg.num_layers):
        pre = f"{TR}.{i}."
        keys.update({pre + "self_attn.in_projs.0.weight": (3 * d, d), pre + "self_attn.out_projs.0.weight": (d, d),
                     pre + "norm1.weight": (d,), pre + "norm1.bias": (d,), pre + "norm2.weight": (d,),
                     pre + "norm2.bias": (d,), pre + "linear1.weight": (ff, d), pre + "linear2.weight": (d, ff),
                     pre + "layer_scale_1.scale": (d,), pre + "layer_scale_2.scale": (d,)})
    return keys


def _seanet_keys(cfg: MimiConfig) -> Dict[str, Tuple[int, ...]]:
    idx = seanet_indices(cfg)
    top = 2 ** len(cfg.ratios) * cfg.n_filters
    keys = {f"decoder.model.{idx['conv_in']}.conv.conv.weight": (top, cfg.dimension, cfg.kernel_size),
            f"decoder.model.{idx['conv_in']}.conv.conv.bias": (top,)}
    for s, ((cin, cout), r) in enumerate(zip(cfg.stage_channels(), cfg.ratios)):
        pre = f"decoder.model.{idx[f'stage{s}.convtr']}.convtr.convtr."
        keys[pre + "weight"], keys[pre + "bias"] = (cin, cout, 2 * r), (cout,)
        hidden = cout // cfg.compress
        for j in range(cfg.n_residual_layers):
            pre = f"decoder.model.{idx[f'stage{s}.res{j}']}.block."
            keys[pre + "1.conv.conv.weight"] = (hidden, cout, cfg.residual_kernel_size)
            keys[pre + "1.conv.conv.bias"] = (hidden,)
            keys[pre + "3.conv.conv.weight"] = (cout, hidden, 1)
            keys[pre + "3.conv.conv.bias"] = (cout,)
    keys[f"decoder.model.{idx['conv_out']}.conv.conv.weight"] = (1, cfg.n_filters, cfg.last_kernel_size)
    keys[f"decoder.model.{idx['conv_out']}.conv.conv.bias"] = (1,)
    return keys


def decoder_keys(cfg: MimiConfig) -> Dict[str, Tuple[int, ...]]:
    """Every moshi state-dict key the decoder reads, with its shape."""
    keys = _codebook_keys(cfg)
    keys["upsample.convtr.convtr.convtr.weight"] = (cfg.dimension, 1, 2 * cfg.upsample_stride)
    keys.update(_transformer_keys(cfg))
    keys.update(_seanet_keys(cfg))
    return keys


def _alias(key: str) -> str:
    for new, old in ALIASES.items():
        if key.endswith(new):
            return key[: -len(new)] + old
    return key


def check_state(state: Dict[str, torch.Tensor], cfg: MimiConfig, source: str = "checkpoint") -> Dict[str, torch.Tensor]:
    """Pick the decoder's keys out of ``state`` (resolving aliases); raise one error listing every problem."""
    what = (f"a Mimi decoder of these dims (d={cfg.dimension}, {cfg.num_layers} layers, "
            f"{cfg.n_q} codebooks x {cfg.bins})")
    return pick_expected(state, decoder_keys(cfg), source, what, alias=_alias)


def load_checkpoint(path: str, cfg: MimiConfig) -> Dict[str, torch.Tensor]:
    """Read a Mimi ``.safetensors`` file (moshi's key names) and check it against ``cfg``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Mimi checkpoint not found: {path}")
    if not path.endswith((".safetensors", ".sft", ".sfts")):
        raise ValueError(f"Mimi checkpoint must be a .safetensors file (moshi's layout), got {path}")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from engine.models.checkfiles import safetensors_header
    try:                                           # dtypes, shapes and offsets checked before anything is read
        header = safetensors_header(path)
    except ValueError as e:
        msg = str(e)
        reason = "it " + msg[len(path):].strip() if msg.startswith(path) else msg
        raise ValueError(f"cannot read {path} as safetensors: {reason}") from None
    want = decoder_keys(cfg)
    wrong = [k for k, shape in want.items() if k in header and header[k][1] != tuple(shape)]
    if wrong:
        raise ValueError(_wrong_size(path, header, cfg, wrong[0], want))
    try:
        state = load_file(path, device="cpu")
    except (SafetensorError, OSError) as e:
        raise ValueError(f"cannot read {path} as safetensors: {e}") from e
    return check_state(state, cfg, source=path)


def _wrong_size(path: str, header, cfg: MimiConfig, key: str, want) -> str:
    """Why a checkpoint does not fit ``cfg``; when it holds the released decoder and ``cfg`` is another size (the
    tiny one ``--size auto`` picks on a CPU), the flag that loads it."""
    from .config import RELEASED
    released = decoder_keys(RELEASED)
    if cfg != RELEASED and all(header.get(k, header.get(_alias(k), (None, None)))[1] == tuple(s)
                               for k, s in released.items()):
        return (f"{path} holds the released Mimi decoder, but this session builds the smaller test size (--size "
                f"auto picks it on a CPU): give --size released to load it")
    return f"{path} is not a Mimi decoder of these dims: {key} is {header[key][1]}, expected {tuple(want[key])}"


def codebook(state: Dict[str, torch.Tensor], part: str, j: int) -> torch.Tensor:
    """Codebook ``j`` of ``part`` (rvq_first | rvq_rest) as moshi computes it: [bins, dim]."""
    pre = f"quantizer.{part}.vq.layers.{j}._codebook."
    return state[pre + "embedding_sum"] / state[pre + "cluster_usage"].clamp(min=CODEBOOK_EPS)[:, None]


def random_state(cfg: MimiConfig, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Seeded random decoder weights in moshi's layout, scaled so every stage stays in range."""
    g = torch.Generator().manual_seed(int(seed))
    out: Dict[str, torch.Tensor] = {}
    for key, shape in decoder_keys(cfg).items():
        out[key] = _random_tensor(key, shape, g)
    return out


def _random_tensor(key: str, shape, g: torch.Generator) -> torch.Tensor:
    def randn(scale):
        return torch.randn(shape, generator=g) * scale
    if key.endswith("cluster_usage"):
        return 0.5 + torch.rand(shape, generator=g)
    if key.endswith("embedding_sum"):
        return randn(1.0)
    if "layer_scale" in key:
        return 0.05 + 0.25 * torch.rand(shape, generator=g)
    if "norm" in key:
        return (1.0 + randn(0.1)) if key.endswith("weight") else randn(0.1)
    if key.endswith("bias"):
        return randn(0.02)
    if key.startswith("upsample"):                    # depthwise: one input channel per output
        return randn(0.5)
    if "convtr" in key and len(shape) == 3:            # [in, out/groups, K]: overlap-add of K/stride taps
        return randn(1.0 / (shape[0] * shape[2] / 2) ** 0.5)
    fan_in = 1
    for s in shape[1:]:
        fan_in *= s
    return randn(1.0 / fan_in ** 0.5)


def save_checkpoint(state: Dict[str, torch.Tensor], path: str) -> None:
    """Write a moshi-layout state dict as ``.safetensors``."""
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, path)
