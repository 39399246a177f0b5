"""Backbones: LISTEN + THINK in front of a decoder tail. Each backbone is a package here that registers a
:class:`~engine.registry.BackboneEntry` (see :mod:`engine.registry`); the modules beside them are shared."""
from .base import Backbone, BackboneInfo, Thought, TokenFormat, make_backbone

__all__ = ["Backbone", "BackboneInfo", "Thought", "TokenFormat", "make_backbone"]
