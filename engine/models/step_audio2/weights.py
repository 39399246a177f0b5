"""Weights for the Step-Audio2 tail: seeded random (released or tiny dims) or the released checkpoint folder.

Checkpoint folder layout (as released with Step-Audio-2-mini's token2wav):
``flow.yaml`` (constructor arguments, read safely, see :mod:`.config`), ``flow.pt`` and ``hift.pt``
(plain state dicts, loaded with ``weights_only=True``; hift.pt's keys may carry a ``generator.`` prefix and
old-style ``weight_g``/``weight_v`` weight norm). A missing or mismatched file is one clear error naming it.
"""
from __future__ import annotations

import math
import pickle
import re
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from engine.checkpoints import check_tensor

from .config import HiFTConfig, T2WConfig, flow_config_from_yaml, preset, with_n_timesteps
from .model import StepAudio2Token2Wav

FLOW_FILES = ("flow.yaml", "flow.pt", "hift.pt")


def _init_value(name: str, shape: Tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """A finite, well-scaled random value for one parameter (so 16 DiT blocks and exp() stay bounded)."""
    x = torch.randn(shape, generator=g)
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("parametrizations.weight.original0") or leaf == "alpha":
        return 1.0 + 0.1 * x                                   # weight-norm gains, Snake alphas
    if leaf in ("pos_bias_u", "pos_bias_v"):
        return 0.1 * x
    if leaf == "bias" or len(shape) == 1:
        is_norm = any(k in name for k in ("norm", "out.1", "block.3"))
        if is_norm and leaf == "weight":
            return 1.0 + 0.1 * x
        return 0.02 * x
    if "input_embedding" in name:
        return x
    fan_in = int(math.prod(shape[1:])) if len(shape) > 1 else shape[0]
    scale = 1.0 / math.sqrt(max(fan_in, 1))
    if "adaLN_modulation" in name or "final_layer.linear" in name:
        scale *= 0.2                                           # adaLN-zero layers: small, not zero
    if "conv_post" in name:
        scale *= 0.5
    return scale * x


def random_state_dict(cfg: T2WConfig, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Seeded random weights for every parameter of :class:`StepAudio2Token2Wav` (CPU, float32)."""
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in StepAudio2Token2Wav(cfg).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    return {k: _init_value(k, shapes[k], g) for k in sorted(shapes)}


def build(cfg: T2WConfig, state: Dict[str, torch.Tensor], device="cpu") -> StepAudio2Token2Wav:
    """The model with ``state`` loaded (strict), moved to ``device`` and prepared (constants built there)."""
    model = StepAudio2Token2Wav(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not match the model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    model = model.to(device).eval().prepare()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()           # give back what prepare() parked on the CPU
    return model


def random_model(size: str = "released", seed: int = 0, device="cpu",
                 n_timesteps: Optional[int] = None) -> StepAudio2Token2Wav:
    """Seeded random weights at ``size``; ``n_timesteps``: the flow's Euler steps (None: the preset's)."""
    cfg = with_n_timesteps(preset(size), n_timesteps)
    return build(cfg, random_state_dict(cfg, seed), device)


# -- released checkpoint ----------------------------------------------------------------------------------

def _hift_name(key: str) -> str:
    """A hift.pt key as our model names it (no ``generator.`` prefix, parametrized weight norm)."""
    k = key[len("generator."):] if key.startswith("generator.") else key
    if k.endswith(".weight_g"):
        return k[:-len("weight_g")] + "parametrizations.weight.original0"
    if k.endswith(".weight_v"):
        return k[:-len("weight_v")] + "parametrizations.weight.original1"
    return k


def _hift_keys(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {_hift_name(k): v for k, v in state.items()}


def _hift_config(sd: Dict[str, torch.Tensor], path: Path) -> HiFTConfig:
    """The stock builds ``HiFTGenerator()`` with its defaults; only the widths are read from the weights."""
    try:
        base = sd["conv_pre.parametrizations.weight.original1"].shape[0]
        f0 = sd["f0_predictor.condnet.0.parametrizations.weight.original1"].shape[0]
    except KeyError as e:
        raise ValueError(f"{path}: not a HiFT generator state dict (no {e.args[0]})") from None
    return HiFTConfig(base_channels=int(base), f0_channels=int(f0))


def _load_pt(path: Path) -> Dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:                      # torch's several lines advise loading unsafely: not ours
        what = re.search(r"GLOBAL (\S+)", str(e))
        raise ValueError(f"{path} holds pickled code or objects other than tensors"
                         f"{' (' + what.group(1) + ')' if what else ''}: refused (only a plain state dict of tensors "
                         f"is loaded)") from None
    except Exception as e:                                   # noqa: BLE001 (any unreadable file: one message)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"{path}: not a readable weights file ({type(e).__name__}: {first})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a state dict of tensors")
    return state


def checkpoint_state(folder) -> Tuple[T2WConfig, Dict[str, torch.Tensor]]:
    """(config, state dict) from a released token2wav folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder {folder} does not exist")
    for name in FLOW_FILES:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"checkpoint folder {folder} has no {name}")
    flow_cfg = flow_config_from_yaml(folder / "flow.yaml")
    flow_sd = _load_pt(folder / "flow.pt")
    hift_raw = _load_pt(folder / "hift.pt")
    hift_sd = _hift_keys(hift_raw)
    in_file = {"flow.pt": {}, "hift.pt": {_hift_name(k): k for k in hift_raw}}   # our key -> the file's
    cfg = T2WConfig(flow=flow_cfg, hift=_hift_config(hift_sd, folder / "hift.pt"))
    with torch.device("meta"):
        ref = StepAudio2Token2Wav(cfg).state_dict()
    state = {}
    for prefix, sd, fname in (("flow.", flow_sd, "flow.pt"), ("hift.", hift_sd, "hift.pt")):
        want = {k[len(prefix):]: tuple(v.shape) for k, v in ref.items() if k.startswith(prefix)}
        missing = sorted(set(want) - set(sd))
        extra = sorted(set(sd) - set(want))
        bad = sorted(k for k in want if k in sd and tuple(sd[k].shape) != want[k])
        if missing or extra or bad:
            raise ValueError(f"{folder / fname} does not match flow.yaml's model: missing {missing[:4]}, "
                             f"unexpected {extra[:4]}, wrong shape {bad[:4]}")
        for k in want:
            if ref[prefix + k].dtype.is_floating_point:
                check_tensor(in_file[fname].get(k, k), sd[k], str(folder / fname))
        state.update({prefix + k: v.float() for k, v in sd.items()})
    return cfg, state


def checkpoint_model(folder, device="cpu", n_timesteps: Optional[int] = None) -> StepAudio2Token2Wav:
    """The released folder's weights; ``n_timesteps``: the flow's Euler steps (None: the config's)."""
    cfg, state = checkpoint_state(folder)
    return build(with_n_timesteps(cfg, n_timesteps), state, device)


def load_model(checkpoint: Optional[str], size: str = "released", seed: int = 0, device="cpu",
               n_timesteps: Optional[int] = None):
    """A checkpoint folder if given, else seeded random weights at ``size``; the flow solved in
    ``n_timesteps`` Euler steps (None: the config's, 10), fixed in the config the model is built from."""
    if checkpoint:
        return checkpoint_model(checkpoint, device, n_timesteps)
    return random_model(size, seed, device, n_timesteps)
