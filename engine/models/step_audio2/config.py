"""Dimensions of the Step-Audio2 token2wav (flow + HiFT), presets by name, and flow.yaml parsing.

``released`` is the MiniCPM-o 4.5 / Step-Audio-2-mini decoder (flow 155.8M, HiFT 20.8M parameters);
``tiny`` keeps every width the stock runtime hard-codes (hidden 512, 8 heads x 64) and shrinks depth,
feed-forward widths and the vocoder, for CPU tests and the CPU app. ``oracle`` is the size the bit-exact
tests build the stock package at (depth and block counts shrunk, widths kept).

flow.yaml is read with ``yaml.safe_load`` after its hyperpyyaml tags (``!new:``, ``!ref``, ``!name:``...)
are turned into plain mappings: only the constructor arguments are taken, no object is ever built.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Tuple

import yaml

SILENCE_TOKEN = 4218
TOKEN_RATE = 25            # speech tokens per second
MEL_RATE = 50              # mel frames per second
SAMPLE_RATE = 24000
HOP = 480                  # samples per mel frame
CHUNK_TOKENS = 25          # new tokens per streamed chunk (1 s)
LOOKAHEAD = 3              # tokens of lookahead the encoder needs
MEL_CACHE = 8              # HiFT mel frames carried over (160 ms)
SOURCE_CACHE = MEL_CACHE * HOP   # 3,840 samples of NSF source / speech carried over
WINDOW = 100               # estimator / conformer caches keep the prompt plus this many frames


@dataclass(frozen=True)
class EncoderConfig:
    input_size: int = 512
    output_size: int = 512
    heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    num_up_blocks: int = 4
    pre_lookahead: int = LOOKAHEAD
    up_stride: int = 2


@dataclass(frozen=True)
class DiTConfig:
    in_channels: int = 320
    out_channels: int = 80
    hidden: int = 512
    depth: int = 16
    heads: int = 8
    head_dim: int = 64
    mlp_ratio: float = 4.0


@dataclass(frozen=True)
class FlowConfig:
    vocab_size: int = 6561
    input_size: int = 512
    output_size: int = 80
    spk_embed_dim: int = 192
    n_timesteps: int = 10
    cfg_rate: float = 0.7
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    dit: DiTConfig = field(default_factory=DiTConfig)


@dataclass(frozen=True)
class HiFTConfig:
    in_channels: int = 80
    base_channels: int = 512
    f0_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = SAMPLE_RATE
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: Tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: Tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: Tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: Tuple[Tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: Tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: Tuple[Tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99


@dataclass(frozen=True)
class T2WConfig:
    """The whole tail: flow + vocoder."""

    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiFTConfig = field(default_factory=HiFTConfig)


def preset(size: str) -> T2WConfig:
    """``released`` | ``tiny`` | ``oracle``."""
    if size == "released":
        return T2WConfig()
    if size in ("tiny", "oracle"):
        enc = EncoderConfig(linear_units=256, num_blocks=1, num_up_blocks=1)
        dit = DiTConfig(depth=2, mlp_ratio=0.5)
        hift = HiFTConfig(base_channels=32, f0_channels=32)
        if size == "oracle":
            enc = replace(enc, num_blocks=2)
        return T2WConfig(flow=FlowConfig(encoder=enc, dit=dit), hift=hift)
    raise ValueError(f"unknown step-audio2 size {size!r} (expected 'released' or 'tiny')")


# -- flow.yaml -----------------------------------------------------------------------------------------

class _TaggedLoader(yaml.SafeLoader):
    """SafeLoader that reads hyperpyyaml tags as plain data (never constructs or imports anything)."""


def _tagged(loader, tag_suffix, node):
    if isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    return {"__tag__": tag_suffix, "args": value}


_TaggedLoader.add_multi_constructor("!", _tagged)


def read_flow_yaml(path) -> Dict[str, Any]:
    """The ``flow`` mapping of a released flow.yaml, tags kept as ``{'__tag__', 'args'}``, refs resolved."""
    path = Path(path)
    try:
        doc = yaml.load(path.read_text(), Loader=_TaggedLoader)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not a readable flow.yaml ({e})") from None
    if not isinstance(doc, dict) or "flow" not in doc:
        raise ValueError(f"{path}: no top-level 'flow' entry")
    return _resolve(doc["flow"], doc)


def _resolve(node, root):
    if isinstance(node, dict):
        if node.get("__tag__") == "ref" and isinstance(node.get("args"), str):
            ref = node["args"].strip()
            key = ref[1:-1] if ref.startswith("<") and ref.endswith(">") else ref
            if key not in root:
                raise ValueError(f"flow.yaml: !ref {ref} names no top-level entry")
            return _resolve(root[key], root)
        return {k: _resolve(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, root) for v in node]
    return node


def _args(node, what: str) -> Dict[str, Any]:
    if not isinstance(node, dict) or not isinstance(node.get("args"), dict):
        raise ValueError(f"flow.yaml: '{what}' is not a constructor mapping")
    return node["args"]


def _check(cls_tag: str, node, expected_suffix: str, what: str) -> None:
    tag = (node or {}).get("__tag__") or ""
    if not tag.endswith(expected_suffix):
        raise ValueError(f"flow.yaml: '{what}' is {tag or 'missing'}, expected a {expected_suffix} ({cls_tag})")


def flow_config_from_yaml(path) -> FlowConfig:
    """Constructor arguments of the flow, its encoder and its DiT estimator, as a :class:`FlowConfig`."""
    flow = read_flow_yaml(path)
    _check("flow", flow, "CausalMaskedDiffWithXvec", "flow")
    fa = _args(flow, "flow")
    ea = _args(fa.get("encoder"), "flow.encoder")
    dec = _args(fa.get("decoder"), "flow.decoder")
    da = _args(dec.get("estimator"), "flow.decoder.estimator")
    if ea.get("pos_enc_layer_type", "rel_pos_espnet") != "rel_pos_espnet" or \
            ea.get("selfattention_layer_type", "rel_selfattn") != "rel_selfattn":
        raise ValueError("flow.yaml: only the rel_pos_espnet / rel_selfattn encoder is supported")
    enc = EncoderConfig(
        input_size=int(ea.get("input_size", 512)), output_size=int(ea.get("output_size", 512)),
        heads=int(ea.get("attention_heads", 8)), linear_units=int(ea.get("linear_units", 2048)),
        num_blocks=int(ea.get("num_blocks", 6)), num_up_blocks=int(ea.get("num_up_blocks", 4)),
        pre_lookahead=int(ea.get("pre_lookahead_len", LOOKAHEAD)), up_stride=int(ea.get("up_stride", 2)))
    dit = DiTConfig(
        in_channels=int(da.get("in_channels", 320)), out_channels=int(da.get("out_channels", 80)),
        hidden=int(da.get("hidden_size", 512)), depth=int(da.get("depth", 16)),
        heads=int(da.get("num_heads", 8)), head_dim=int(da.get("head_dim", 64)),
        mlp_ratio=float(da.get("mlp_ratio", 4.0)))
    return FlowConfig(
        vocab_size=int(fa.get("vocab_size", 6561)), input_size=int(fa.get("input_size", 512)),
        output_size=int(fa.get("output_size", 80)), spk_embed_dim=int(fa.get("spk_embed_dim", 192)),
        cfg_rate=float(dec.get("inference_cfg_rate", 0.7)), encoder=enc, dit=dit)
