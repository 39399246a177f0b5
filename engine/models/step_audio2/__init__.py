"""Step-Audio2 token2wav (Step-Audio-2-mini) on the engine.

Registers ``step-audio2``: ``plan(size=, steps=, prompt_seconds=6)``, ``make_tail(size=, device=, seed=,
checkpoint=, prompt=, n_timesteps=)``, ``synth(args)`` for ``duplexcadence synth`` (with its own options) and its
conditioning, the voice prompt (:mod:`.voice`).
"""
from __future__ import annotations

from typing import Optional

import torch

from engine.core import make_plan
from engine.registry import ModelEntry, Option, register

from .config import TOKEN_RATE, flow_steps, preset, with_n_timesteps
from .model import StepAudio2Token2Wav
from .voice import CONDITIONING


def plan(size: str = "released", steps: Optional[int] = None, prompt_seconds: float = 6.0,
         n_timesteps: Optional[int] = None, **_):
    """The planner's view of a session (no weights: built on the meta device)."""
    cfg = with_n_timesteps(preset(size), n_timesteps)
    with torch.device("meta"):
        model = StepAudio2Token2Wav(cfg)
    frames = 2 * max(1, int(round(prompt_seconds * TOKEN_RATE)))
    spec = model.spec(frames, steps, label=f"step-audio2 {size}, {prompt_seconds:g} s prompt")
    return make_plan(model.regions(spec), spec)


def make_tail(size: str = "released", device="cpu", seed: int = 0, checkpoint: Optional[str] = None,
              prompt=None, mode: str = "graphs", shared: Optional[dict] = None, n_timesteps: Optional[int] = None):
    """``prompt``: a voice file (.npz / .wav), a ready :class:`~.stream.Prompt`, or None (synthetic).
    ``shared``: another tail's ``shared_weights()`` (same size/device/checkpoint/seed/steps): nothing is loaded.
    ``n_timesteps``: the flow's Euler steps (None: the config's, 10 as Step-Audio2's stock; MiniCPM-o 4.5's
    duplex loop asks for 5), fixed in the config the model is built from. Shared weights hold their step
    count's constants: another count is an error."""
    from .prompt import load_prompt
    from .stream import Prompt
    from .tail import StepAudio2Tail
    from .weights import load_model
    steps = None if n_timesteps is None else flow_steps(n_timesteps)
    if shared is not None:
        model, voice = shared["model"], shared["prompt"]
        have = model.cfg.flow.n_timesteps
        if steps is not None and steps != have:
            raise ValueError(f"the shared step-audio2 weights solve the flow in {have} steps, not {steps}: "
                             f"the flow-step count must be part of the shared-weights key")
    else:
        voice = prompt if isinstance(prompt, Prompt) else load_prompt(prompt, checkpoint, seed)
        model = load_model(checkpoint, size, seed, device, steps)
    return StepAudio2Tail(model, voice, "checkpoint" if checkpoint else size, synthetic=checkpoint is None, mode=mode)


def _synth(args):
    from .synth import synth
    return synth(args)


def resolve_checkpoint(path: str) -> str:
    """A token2wav folder, checked by content: flow.yaml must parse as the flow's constructor arguments,
    flow.pt and hift.pt must be PyTorch files (their weights are checked when they load)."""
    from engine.models import checkfiles
    from .config import flow_config_from_yaml
    from .weights import FLOW_FILES
    folder = checkfiles.existing_folder(path, "Step-Audio2 checkpoint folder")
    checkfiles.require_files(folder, FLOW_FILES)
    flow_config_from_yaml(folder / "flow.yaml")
    for name in ("flow.pt", "hift.pt"):
        checkfiles.torch_file(folder / name)
    return str(folder)


register(ModelEntry(name="step-audio2", title="Step-Audio2 token2wav (Step-Audio-2-mini)",
                    architecture="conformer encoder + DiT flow matching (10 Euler steps, 5 under MiniCPM-o 4.5; "
                                 "CFG) + HiFT vocoder",
                    plan=plan, make_tail=make_tail, synth=_synth, resolve_checkpoint=resolve_checkpoint,
                    checkpoint_hint="token2wav folder (flow.yaml, flow.pt, hift.pt)",
                    conditioning=CONDITIONING,
                    options=(Option("--prompt", "voice prompt: .npz (prompt_tokens, prompt_mel, speaker_embedding) "
                                    "or .wav", kind="file"),
                             Option("--tokens", "1-D int .npy of 25 Hz speech tokens", kind="file")),
                    order=0,
                    bench=("engine.bench.step_audio2", "Step-Audio2 token2wav: stock package vs our three modes (GPU)")))
