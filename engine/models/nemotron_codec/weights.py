"""Codec weights in nemo's ``RVQVAEModel`` layout: key names, seeded random weights, checkpoint reading.

``codec.safetensors`` holds the state dict of nemo's ``RVQVAEModel`` (encoder keys may be present and
are ignored). The decoder reads:

* ``prvq.mus_list.{i}`` [codebook_size, latent]                       — codebook i;
* ``decoder.layers.{j}.weight`` [C_in, C_out / groups, rate]           — stage s's transposed conv,
  ``j = s * (1 + num_blocks)``;
* ``decoder.layers.{j}.{dwconv,norm,pwconv1,pwconv2}.{weight,bias}``   — the ConvNeXt blocks after it;
* ``decoder.layers.{last}.weight`` [n_fft + 2, C, 1]                   — the head.

A VoiceChat checkpoint keeps the same names under ``tts_model.audio_codec.`` in ``model.safetensors``.
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import torch

from engine.checkpoints import pick_expected

from .config import CodecConfig

BLOCK_PARAMS = (("dw_w", "dwconv.weight"), ("dw_b", "dwconv.bias"), ("norm_w", "norm.weight"),
                ("norm_b", "norm.bias"), ("pw1_w", "pwconv1.weight"), ("pw1_b", "pwconv1.bias"),
                ("pw2_w", "pwconv2.weight"), ("pw2_b", "pwconv2.bias"))


def decoder_keys(cfg: CodecConfig) -> Dict[str, Tuple[int, ...]]:
    """Every nemo key the decoder reads, with its shape."""
    keys = {f"prvq.mus_list.{i}": (cfg.codebook_size, cfg.latent_size) for i in range(cfg.num_quantizers)}
    nb = cfg.num_blocks
    for s, ((c_in, c_out), r) in enumerate(zip(cfg.stage_channels(), cfg.stage_rates())):
        j = s * (1 + nb)
        keys[f"decoder.layers.{j}.weight"] = (c_in, c_out // cfg.groups, r)
        for b in range(nb):
            p = f"decoder.layers.{j + 1 + b}."
            shapes = {"dwconv.weight": (c_out, 1, cfg.kernel_size), "dwconv.bias": (c_out,),
                      "norm.weight": (c_out,), "norm.bias": (c_out,), "pwconv1.weight": (4 * c_out, c_out, 1),
                      "pwconv1.bias": (4 * c_out,), "pwconv2.weight": (c_out, 4 * c_out, 1), "pwconv2.bias": (c_out,)}
            keys.update({p + k: v for k, v in shapes.items()})
    keys[f"decoder.layers.{len(cfg.rates) * (1 + nb)}.weight"] = (cfg.n_fft + 2, cfg.stage_channels()[-1][1], 1)
    return keys


def check_state(state: Dict[str, torch.Tensor], cfg: CodecConfig, source: str) -> Dict[str, torch.Tensor]:
    """The decoder's tensors from ``state`` as float32 (finite floats); one ValueError listing what is wrong."""
    return pick_expected(state, decoder_keys(cfg), source, "this codec's decoder")


def load_into(model, sd: Dict[str, torch.Tensor]) -> None:
    """Copy a checked nemo-layout state dict into a :class:`NemotronCodecDecoder`."""
    cfg, nb = model.cfg, model.cfg.num_blocks
    with torch.no_grad():
        model.codebooks.copy_(torch.stack([sd[f"prvq.mus_list.{i}"] for i in range(cfg.num_quantizers)]))
        for s, (w, blocks) in enumerate(zip(model.upsample, model.stages)):
            j = s * (1 + nb)
            w.copy_(sd[f"decoder.layers.{j}.weight"])
            for b, block in enumerate(blocks):
                for ours, theirs in BLOCK_PARAMS:
                    getattr(block, ours).copy_(sd[f"decoder.layers.{j + 1 + b}.{theirs}"])
        model.head.proj.copy_(sd[f"decoder.layers.{len(cfg.rates) * (1 + nb)}.weight"])


def random_state(cfg: CodecConfig, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Seeded random weights in nemo's layout, scaled so the decoded audio stays out of saturation:
    unit-variance latents, blocks that keep the variance, a head whose log-magnitudes sit well below
    the magnitude cap and whose phases spread over several turns."""
    g = torch.Generator().manual_seed(int(seed))
    out: Dict[str, torch.Tensor] = {}
    for key, shape in decoder_keys(cfg).items():
        x = torch.randn(shape, generator=g)
        if key.startswith("prvq."):
            x = x / math.sqrt(cfg.latent_size * cfg.num_quantizers) * math.sqrt(cfg.latent_size) / 2
        elif key.endswith("norm.weight"):
            x = 1.0 + 0.1 * x
        elif key.endswith(".bias"):
            x = 0.05 * x
        elif key.endswith("pwconv2.weight"):
            x = 0.5 * x / math.sqrt(shape[1])
        elif len(shape) == 3 and shape[0] == cfg.n_fft + 2:                # the head
            x = x / math.sqrt(shape[1])
            x[: cfg.spec_bins] *= 0.5
            x[: cfg.spec_bins, 0] = -1.0            # channel 0 carries +2 (below): log-magnitudes near -2
            x[cfg.spec_bins:] *= 3.0                # phases over several turns
        else:
            fan_in = math.prod(shape[1:]) if key.endswith(("dwconv.weight", "pwconv1.weight")) else shape[0]
            x = x / math.sqrt(max(1, fan_in))
        out[key] = x.contiguous()
    last = f"decoder.layers.{len(cfg.rates) * (1 + cfg.num_blocks) - 1}.pwconv2.bias"
    if last in out:
        out[last][0] = 2.0                          # a steady offset on channel 0 of the head's input
    return out


def save(state: Dict[str, torch.Tensor], path: str) -> None:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
