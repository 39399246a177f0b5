"""Dimensions of the Step-Audio2 token2wav (flow + HiFT), presets by name, and flow.yaml parsing.

``released`` is the Step-Audio-2-mini decoder (flow 155.8M, HiFT 20.8M parameters);
``tiny`` keeps every width the stock runtime hard-codes (hidden 512, 8 heads x 64) and shrinks depth,
feed-forward widths and the vocoder, for CPU tests and the CPU app. ``oracle`` is the size the bit-exact
tests build the stock package at (depth and block counts shrunk, widths kept).

flow.yaml is read by the bounded safe loader (:mod:`engine.safeload`) after its hyperpyyaml tags
(``!new:``, ``!ref``, ``!name:``...)
are turned into plain mappings: only the constructor arguments are taken, no object is ever built.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from engine import safeload

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


def flow_steps(n) -> int:
    """``n`` checked as a flow-step count: a positive whole number (one ValueError otherwise)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n_timesteps: the flow needs a positive whole number of steps, got {n!r}")
    return n


def with_n_timesteps(cfg: T2WConfig, n_timesteps: Optional[int]) -> T2WConfig:
    """``cfg`` with its flow solved in ``n_timesteps`` Euler steps (None: ``cfg`` as it is), set before the
    model is built so its regions, Euler schedule and DiT constants are made for that count."""
    if n_timesteps is None:
        return cfg
    return replace(cfg, flow=replace(cfg.flow, n_timesteps=flow_steps(n_timesteps)))


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
#
# The document is bounded before anything is built from it: its size, its YAML aliases (an alias bomb
# shares nodes while parsing but explodes when walked), its nesting depth and the number of nodes the
# resolved 'flow' entry may expand to. Every value read is type- and range-checked; every failure is
# one ValueError naming the file.

MAX_YAML_BYTES = 1 << 20          # a released flow.yaml is ~5 KB
MAX_FLOW_NODES = 50_000           # nodes of the resolved 'flow' entry
MAX_REF_CHAIN = 32                # !ref inside !ref ...
MAX_DIM = 1 << 20                 # the largest width or count a constructor argument may give


def read_flow_yaml(path) -> Dict[str, Any]:
    """The ``flow`` mapping of a released flow.yaml, tags kept as ``{'__tag__', 'args'}``, refs resolved.

    Read through the bounded loader every YAML file goes through (:func:`engine.safeload.load_yaml`)."""
    path = Path(path)
    doc = safeload.load_yaml(path, "flow.yaml", MAX_YAML_BYTES, keep_tags=True)
    if not isinstance(doc, dict) or "flow" not in doc:
        raise ValueError(f"{path}: no top-level 'flow' entry")
    return _Resolver(doc, path).resolve(doc["flow"], ("flow",))


class _Resolver:
    """Replaces ``!ref <key>`` by the top-level entry ``key`` (a copy), with a node budget and cycle check."""

    def __init__(self, root: Dict[str, Any], path: Path):
        self.root, self.path, self.nodes = root, path, 0

    def resolve(self, node, chain: Tuple[str, ...]):
        self.nodes += 1
        if self.nodes > MAX_FLOW_NODES:
            raise ValueError(f"{self.path}: 'flow' expands to more than {MAX_FLOW_NODES} nodes "
                             f"(aliases or !ref repeated); not a flow.yaml")
        if isinstance(node, dict):
            if node.get("__tag__") == "ref" and isinstance(node.get("args"), str):
                return self._ref(node["args"].strip(), chain)
            return {k: self.resolve(v, chain) for k, v in node.items()}
        if isinstance(node, list):
            return [self.resolve(v, chain) for v in node]
        return node

    def _ref(self, ref: str, chain: Tuple[str, ...]):
        key = ref[1:-1] if ref.startswith("<") and ref.endswith(">") else ref
        if key not in self.root:
            raise ValueError(f"{self.path}: !ref {ref} names no top-level entry")
        if len(chain) > MAX_REF_CHAIN:
            raise ValueError(f"{self.path}: !ref nested more than {MAX_REF_CHAIN} deep; not a flow.yaml")
        if key in chain:
            raise ValueError(f"{self.path}: !ref cycle {' -> '.join(chain[chain.index(key):] + (key,))}")
        return self.resolve(self.root[key], chain + (key,))


def _kind(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "empty"}.get(type(value), "a number")


def _node(node, expected_suffix: str, what: str, path: Path) -> Dict[str, Any]:
    """The constructor arguments of ``!new:...<expected_suffix>`` at ``what``; one line if it is anything else."""
    if not isinstance(node, dict) or "__tag__" not in node:
        raise ValueError(f"{path}: '{what}' must be a !new:...{expected_suffix} constructor, found {_kind(node)}")
    tag = str(node["__tag__"])
    if not tag.endswith(expected_suffix):
        raise ValueError(f"{path}: '{what}' is !{tag}, expected a !new:...{expected_suffix}")
    args = node.get("args")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise ValueError(f"{path}: '{what}' takes keyword arguments (a mapping), found {_kind(args)}")
    return args


#: tighter bounds than MAX_DIM for the counts that multiply a model's size (the released values: 6, 4, 16,
#: 8 heads; the stock hard-codes heads of 64): sane for this model family, and a model that fits in memory
COUNT_LIMITS = {"num_blocks": 64, "num_up_blocks": 64, "depth": 64, "attention_heads": 64, "num_heads": 64,
                "head_dim": 1024, "linear_units": 1 << 16, "hidden_size": 1 << 13, "input_size": 1 << 13,
                "output_size": 1 << 13, "in_channels": 1 << 13, "out_channels": 1 << 13, "spk_embed_dim": 1 << 13,
                "pre_lookahead_len": 64, "up_stride": 16}


def _int(args: Dict[str, Any], key: str, default: int, what: str, path: Path) -> int:
    v = args.get(key, default)
    top = COUNT_LIMITS.get(key, MAX_DIM)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top:
        raise ValueError(f"{path}: {what}.{key} must be an integer from 1 to {top}, found {v!r:.40}")
    return v


def _float(args: Dict[str, Any], key: str, default: float, what: str, path: Path, top: float) -> float:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= top:
        raise ValueError(f"{path}: {what}.{key} must be a number from 0 to {top:g}, found {v!r:.40}")
    return float(v)


def flow_config_from_yaml(path) -> FlowConfig:
    """Constructor arguments of the flow, its encoder and its DiT estimator, as a :class:`FlowConfig`."""
    path = Path(path)
    fa = _node(read_flow_yaml(path), "CausalMaskedDiffWithXvec", "flow", path)
    ea = _node(fa.get("encoder"), "", "flow.encoder", path)
    dec = _node(fa.get("decoder"), "", "flow.decoder", path)
    da = _node(dec.get("estimator"), "", "flow.decoder.estimator", path)
    if ea.get("pos_enc_layer_type", "rel_pos_espnet") != "rel_pos_espnet" or \
            ea.get("selfattention_layer_type", "rel_selfattn") != "rel_selfattn":
        raise ValueError(f"{path}: only the rel_pos_espnet / rel_selfattn encoder is supported")
    e = "flow.encoder"
    enc = EncoderConfig(
        input_size=_int(ea, "input_size", 512, e, path), output_size=_int(ea, "output_size", 512, e, path),
        heads=_int(ea, "attention_heads", 8, e, path), linear_units=_int(ea, "linear_units", 2048, e, path),
        num_blocks=_int(ea, "num_blocks", 6, e, path), num_up_blocks=_int(ea, "num_up_blocks", 4, e, path),
        pre_lookahead=_int(ea, "pre_lookahead_len", LOOKAHEAD, e, path), up_stride=_int(ea, "up_stride", 2, e, path))
    if enc.output_size % enc.heads:
        raise ValueError(f"{path}: flow.encoder.attention_heads {enc.heads} must divide output_size {enc.output_size}")
    d = "flow.decoder.estimator"
    dit = DiTConfig(
        in_channels=_int(da, "in_channels", 320, d, path), out_channels=_int(da, "out_channels", 80, d, path),
        hidden=_int(da, "hidden_size", 512, d, path), depth=_int(da, "depth", 16, d, path),
        heads=_int(da, "num_heads", 8, d, path), head_dim=_int(da, "head_dim", 64, d, path),
        mlp_ratio=_float(da, "mlp_ratio", 4.0, d, path, 64.0))
    return FlowConfig(
        vocab_size=_int(fa, "vocab_size", 6561, "flow", path), input_size=_int(fa, "input_size", 512, "flow", path),
        output_size=_int(fa, "output_size", 80, "flow", path), spk_embed_dim=_int(fa, "spk_embed_dim", 192, "flow", path),
        cfg_rate=_float(dec, "inference_cfg_rate", 0.7, "flow.decoder", path, 100.0), encoder=enc, dit=dit)
