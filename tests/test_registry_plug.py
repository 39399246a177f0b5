"""Adding a backbone is one new package: a fourth backbone written into a temporary folder (nothing else
touched) is found by the registry, offered by the command lines and runs a whole session. It declares a system
prompt with its default, a 16 kHz native input rate and a reference clip on its entry, and the config, the
session and the system-prompt rule read those declarations (none of them names a backbone).

Also: the registry's lists come from the packages themselves (no name is written anywhere else).
"""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from engine import registry, system_prompt
from engine.audio import frames_of, resample
from engine.bench.session import speech_like
from engine.session import DuplexSession, SessionConfig
from engine.session.input_rate import default_input_rate

PACKAGE = '''
"""A fourth backbone: speaks seeded random tokens every other second, listens otherwise; it takes a system
prompt (its default below), 16 kHz input as is and the session's voice as its reference clip."""
import torch

from engine.backbones.base import Backbone, BackboneInfo, Thought
from engine.registry import BackboneEntry, register_backbone

DEFAULT_PROMPT = "You are a parrot. Repeat what you hear."


class Parrot(Backbone):
    def __init__(self, fmt, *, size, device, seed=0, system_prompt=None, reference_audio=None, **_):
        self.fmt, self.device, self.k = fmt, torch.device(device), 0
        self.gen = torch.Generator().manual_seed(int(seed) + 7)
        self.prompt = DEFAULT_PROMPT if system_prompt is None else system_prompt
        self.clip, self.heard = reference_audio, []
        self.info = BackboneInfo(name="parrot", title="Parrot (test backbone)", synthetic=True)

    def start(self):
        self.k = 0

    def listen(self, audio, vad):
        self.heard.append(int(audio.shape[-1]))

    def think(self, frames):
        self.k += 1
        if self.k % 2:
            return Thought("listen", None, 0)
        tokens = torch.randint(0, self.fmt.vocab, (self.fmt.codebooks, frames), generator=self.gen)
        return Thought("speak", tokens.to(self.device), frames * self.fmt.codebooks)


register_backbone(BackboneEntry(name="parrot", title="Parrot (test backbone)", make=Parrot, order=90,
                                system_prompt=DEFAULT_PROMPT, native_rate=16000, reference_clip=True))
'''


def _voice(path) -> str:
    """A random token2wav voice prompt (.npz: 3 s of tokens, their mel, an x-vector)."""
    rng = np.random.default_rng(4)
    np.savez(path, prompt_tokens=rng.integers(0, 6561, 75), prompt_mel=rng.standard_normal((150, 80)),
             speaker_embedding=rng.standard_normal(192))
    return str(path)


@pytest.fixture
def parrot(tmp_path, monkeypatch):
    """The package in a fresh folder on the registry's search path; the registry as it was afterwards."""
    pkg = tmp_path / "parts" / "parrot_backbone"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(registry, "_BACKBONES", dict(registry._BACKBONES))
    monkeypatch.setattr(registry, "_extra", [])
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setenv(registry.ENV_PATHS, str(tmp_path / "parts"))
    yield "parrot"
    sys.modules.pop("parrot_backbone", None)


def test_the_built_in_parts_register_themselves():
    assert registry.default_tail() == registry.tail_names()[0]
    assert registry.default_backbone() == registry.backbone_names()[0]
    assert SessionConfig().tail == registry.default_tail()
    assert SessionConfig().backbone == registry.default_backbone()
    for e in registry.backbones():
        assert all(t in registry.tail_names() for t in e.tails), e.name     # pairings name real tails


def test_a_fourth_backbone_is_one_package(parrot, one_torch_thread):
    assert parrot in registry.backbone_names()
    from engine.cli.run import build_parser
    a = build_parser().parse_args(["--input", "i.wav", "--output", "o.wav", "--log", "d", "--backbone", parrot])
    assert a.backbone == parrot
    cfg = SessionConfig(tail="mimi", backbone=parrot, size="tiny", device="cpu", seed=5, cpu_threads=1)
    frames = frames_of(speech_like(4, seed=3))[:4]
    runs = []
    for _ in range(2):
        s = DuplexSession(cfg)
        s.start()
        out = [s.process(f) for f in frames]
        s.close()
        assert s.info["backbone_title"] == "Parrot (test backbone)"
        assert [r.decision for _, r in out] == ["listen", "speak"] * 2
        runs.append(np.concatenate([o for o, _ in out]))
    assert np.abs(runs[0]).max() > 0 and np.array_equal(runs[0], runs[1])    # it spoke, deterministically


def test_a_backbone_folder_for_a_backbone_without_weights_is_one_clear_error(parrot):
    with pytest.raises(ValueError, match="the parrot backbone has no weights to load"):
        SessionConfig(backbone=parrot, backbone_checkpoint="/tmp", size="tiny", device="cpu").resolved()


def test_a_fourth_backbone_declares_its_prompt_rate_and_clip(parrot):
    """The declarations reach every reader: the prompt rule, the input rate's default and check."""
    assert registry.get_backbone(parrot).input_rates() == (16000, 24000)
    from parrot_backbone import DEFAULT_PROMPT
    assert default_input_rate(parrot) == 16000 and default_input_rate("synthetic") == 24000
    assert system_prompt.takes_prompt(parrot) and system_prompt.default_for(parrot) == DEFAULT_PROMPT
    assert parrot in system_prompt.PROMPTED_BACKBONES and parrot in registry.prompted_backbones()
    assert not system_prompt.takes_prompt("synthetic") and system_prompt.default_for("synthetic") is None
    with pytest.raises(ValueError, match="input_rate 44100 is not one the parrot backbone takes; choose 16000 Hz "
                                         "or 24000 Hz"):
        SessionConfig(backbone=parrot, size="tiny", device="cpu", input_rate=44100).resolved()
    with pytest.raises(ValueError, match="the synthetic backbone takes none"):
        SessionConfig(backbone="synthetic", size="tiny", device="cpu", system_prompt="hello").resolved()
    SessionConfig(backbone=parrot, size="tiny", device="cpu", input_rate=16000, system_prompt="hi").resolved()


def test_a_fourth_backbone_gets_its_prompt_16k_frames_and_reference_clip_in_a_session(parrot, tmp_path,
                                                                                       one_torch_thread):
    registry.load_all()
    from parrot_backbone import DEFAULT_PROMPT
    voice = _voice(tmp_path / "voice.npz")
    heard = [resample(f, 24000, 16000)[:16000] for f in frames_of(speech_like(2, seed=3))[:2]]
    cfg = SessionConfig(tail="step-audio2", backbone=parrot, size="tiny", device="cpu", seed=5, cpu_threads=1,
                        voice=voice, input_rate=16000, system_prompt="Speak like a parrot.")
    s = DuplexSession(cfg)
    s.start()
    out = [s.process(f) for f in heard]
    bb = s.backbone
    assert (bb.prompt, bb.clip, bb.heard) == ("Speak like a parrot.", voice, [16000, 16000])
    assert s.info["system_prompt"] == "Speak like a parrot."
    assert [r.decision for _, r in out] == ["listen", "speak"]
    s.close()
    plain = DuplexSession(cfg.replace(system_prompt=None, voice=None, input_rate=24000))
    plain.start()
    plain.process(frames_of(speech_like(1, seed=3))[0])
    assert (plain.backbone.prompt, plain.backbone.clip, plain.backbone.heard) == (DEFAULT_PROMPT, None, [24000])
    assert plain.info["system_prompt"] == DEFAULT_PROMPT                # the declared default
    plain.close()


def test_an_entry_refuses_a_trait_it_cannot_mean():
    """An unknown batched step or a native rate that is not a whole number of Hz is one clear error at registration."""
    with pytest.raises(ValueError, match=r"x: batched_steps \['tts'\] unknown; known: llm"):
        registry.BackboneEntry(name="x", title="x", make=object, batched_steps=("tts",))
    for rate in (16000.0, 0, True):
        with pytest.raises(ValueError, match="native_rate must be a positive whole number of Hz"):
            registry.BackboneEntry(name="x", title="x", make=object, native_rate=rate)
    e = registry.BackboneEntry(name="x", title="x", make=object, stage_marks=["tts"],
                               measured_memory=[registry.MeasuredMemory("released", 1.5, "a test")])
    assert e.stage_marks == ("tts",) and e.memory_for("released").gib == 1.5 and e.memory_for("tiny") is None
    assert hash(e) == hash(registry.BackboneEntry(name="x", title="x", make=object, stage_marks=("tts",),
                                                  measured_memory=(registry.MeasuredMemory("released", 1.5, "a test"),)))
