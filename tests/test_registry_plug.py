"""Adding a backbone is one new package: a fourth backbone written into a temporary folder (nothing else
touched) is found by the registry, offered by the command lines and runs a whole session.

Also: the registry's lists come from the packages themselves (no name is written anywhere else).
"""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from engine import registry
from engine.audio import frames_of
from engine.bench.session import speech_like
from engine.session import DuplexSession, SessionConfig

PACKAGE = '''
"""A fourth backbone: speaks seeded random tokens every other second, listens otherwise."""
import torch

from engine.backbones.base import Backbone, BackboneInfo, Thought
from engine.registry import BackboneEntry, register_backbone


class Parrot(Backbone):
    def __init__(self, fmt, *, size, device, seed=0, **_):
        self.fmt, self.device, self.k = fmt, torch.device(device), 0
        self.gen = torch.Generator().manual_seed(int(seed) + 7)
        self.info = BackboneInfo(name="parrot", title="Parrot (test backbone)", synthetic=True)

    def start(self):
        self.k = 0

    def listen(self, audio, vad):
        self.heard = float(audio.abs().max())

    def think(self, frames):
        self.k += 1
        if self.k % 2:
            return Thought("listen", None, 0)
        tokens = torch.randint(0, self.fmt.vocab, (self.fmt.codebooks, frames), generator=self.gen)
        return Thought("speak", tokens.to(self.device), frames * self.fmt.codebooks)


register_backbone(BackboneEntry(name="parrot", title="Parrot (test backbone)", make=Parrot, order=90))
'''


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
